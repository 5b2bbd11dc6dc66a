"""HiGHS (highspy) and OR-Tools load into one process in either order (shared libhighs)."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("first,second", [("highspy", "ortools.sat.python.cp_model"),
                                          ("ortools.sat.python.cp_model", "highspy")])
def test_highspy_and_ortools_import_together(first: str, second: str) -> None:
    code = (f"import {first}, {second}\n"
            "import highspy\n"
            "from ortools.sat.python import cp_model\n"
            "h = highspy.Highs(); h.silent()\n"
            "m = cp_model.CpModel(); x = m.new_int_var(0, 3, 'x'); m.maximize(x)\n"
            "s = cp_model.CpSolver(); assert s.solve(m) == cp_model.OPTIMAL\n"
            "print('ok')\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]
