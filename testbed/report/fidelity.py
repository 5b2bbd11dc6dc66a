"""The report's fidelity section of an emulated run: verdict, invariants, per lightpath and process.

Reads summary.json `fidelity` (testbed.emu.fidelity.verdict) as untrusted data: every
number is checked, every list bounded by table_rows, every text cell escaped by the page.
"""

from __future__ import annotations

import math
from typing import Any

from testbed.emu.scale import Scale
from testbed.errors import RuntimeFailure
from testbed.io.bounded import DirReader
from testbed.report.page import Section, Table
from testbed.report.readers import read_json, table_rows

MAX_REASONS = 20


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


def _shown(v: Any, unit: Any) -> str:
    x = _num(v)
    if x is None:
        return "not measured"
    if unit == "share":
        return f"{100 * x:.1f} %"
    return f"{x:.4g} {str(unit)[:10]}".strip()


def _result(inv: dict[str, Any]) -> str:
    """pass, FAIL, n/a (not measured) or listed (measured, judged by another invariant)."""
    if not inv.get("ok"):
        return "FAIL"
    if not inv.get("measured"):
        return "n/a"
    return "listed" if inv.get("judged") is False else "pass"


def _per_wake_up_ms(proc: dict[str, Any], scale: Scale | None) -> float | None:
    """A process's mean wait for a CPU per wake-up, scenario ms (None: not recorded, or
    the record's scale unreadable)."""
    x = _num(proc.get("wait_per_slice_ms"))
    return None if x is None or scale is None else round(scale.real_ms(x), 4)


def reruns_text(reruns: Any) -> str:
    """The earlier runs of a time_factor auto run, in words ('' when none): each one's
    factor, what failed and the factor it asked for (summary.json time_factor_reruns)."""
    if not isinstance(reruns, list):
        return ""
    parts = []
    for r in reruns[:MAX_REASONS]:
        if not isinstance(r, dict):
            continue
        try:
            f: float | None = Scale.of_record(r, "summary.json time_factor_reruns"
                                              ).time_factor if "time_factor" in r else None
        except RuntimeFailure:
            f = None
        nxt = _num(r.get("next_time_factor"))
        why = "; ".join(str(x)[:200] for x in list(r.get("asks") or [])[:MAX_REASONS])
        parts.append(f"not faithful at time factor {f:g} ({why}), run again from {nxt:g}"
                     if f is not None and nxt is not None else "an earlier run (unreadable)")
    return (" Earlier runs (time_factor auto, checked by the run itself): "
            + "; ".join(parts) + ".") if parts else ""


def fidelity_sections(d: DirReader) -> list[Section]:
    """One section: the verdict and its reasons, a table of the invariants (value,
    threshold, pass/fail, what gave the value, why), then each lightpath's RTT error and
    each process's CPU share and wait per wake-up (scenario time)."""
    summ = read_json(d, "summary.json")
    v = summ.get("fidelity") if isinstance(summ, dict) else None
    if not isinstance(v, dict):
        return []
    reasons = [str(r)[:300] for r in list(v.get("reasons") or [])[:MAX_REASONS]]
    faithful = v.get("faithful") is True
    try:
        scale: Scale | None = Scale.of_record(v, "summary.json fidelity")
    except RuntimeFailure:
        scale = None
    tf = scale.time_factor if scale is not None else None
    text = ("FAITHFUL: every measured invariant held." if faithful else
            "NOT FAITHFUL: " + "; ".join(reasons) + ".") + (
        " Times in scenario time (emulated / time_factor "
        f"{tf:g})." if tf is not None else "") + (
        " Each invariant, its threshold and why: docs/emulation.md, \"Fidelity verdict\".")
    text += reruns_text(summ.get("time_factor_reruns") if isinstance(summ, dict) else None)
    tables = []
    invs = [i for i in list(v.get("invariants") or []) if isinstance(i, dict)]
    rows, note = table_rows(d, invs, "summary.json fidelity.invariants")
    tables.append(Table(
        ["invariant", "value", "bound", "threshold", "result", "where", "protects"],
        [[i.get("name"), _shown(i.get("value"), i.get("unit")),
          "<=" if i.get("bound") == "max" else ">=", _shown(i.get("threshold"), i.get("unit")),
          _result(i), i.get("detail"), i.get("why")] for i in rows],
        "The run's fidelity invariants (n/a: not measured in this run; listed: measured "
        "and shown, judged by another invariant)." + note))
    lps = [x for x in list(v.get("lightpaths") or []) if isinstance(x, dict)]
    if lps:
        rows, note = table_rows(d, lps, "summary.json fidelity.lightpaths")
        tables.append(Table(
            ["DC pair", "fibre hops", "planned RTT (ms)", "median error (ms)",
             "p99 error (ms)", "echoes"],
            [[x.get("pair"), x.get("hops"), _num(x.get("expected_rtt_ms")),
              _num(x.get("median_error_ms")), _num(x.get("p99_error_ms")), x.get("replies")]
             for x in rows],
            "Each lightpath's RTT against 2 x its planned delay (scenario ms)." + note))
    procs = [p for p in list(v.get("processes") or []) if isinstance(p, dict)]
    if procs:
        procs.sort(key=lambda p: (_num(p.get("cpu_share")) or 0.0))
        rows, note = table_rows(d, procs, "summary.json fidelity.processes")
        tables.append(Table(
            ["role", "name", "compute", "CPU share", "wait per wake-up (ms)",
             "CPU used (s)", "waited (s)", "load (cores)"],
            [[p.get("role"), p.get("name"), str(p.get("compute") or "")[:10],
              _shown(p.get("cpu_share"), "share"), _per_wake_up_ms(p, scale),
              _num(p.get("cpu_s")), _num(p.get("wait_s")), _num(p.get("load"))]
             for p in rows],
            "The run's own processes, least served first: share of the time each wanted "
            "a CPU that it had one (schedstat run / (run + wait)), and how long it waited "
            "for one, on average, each time it woke (schedstat wait / time slices, scenario "
            "ms); CPU used and waited in wall seconds." + note))
    return [Section("emulation: fidelity verdict", text, [], tables)]
