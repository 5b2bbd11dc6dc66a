"""Screenshot report pages in headless Chromium (tests/browser.py): the top at 1280 px and
the whole page, for looking at each report kind before a change is called done.

Usage:
  .venv/bin/python scripts/report_screenshots.py OUT_DIR NAME=RUN_DIR [NAME=RUN_DIR ...]
      report each RUN_DIR again (its report.html rewritten) and screenshot it
  .venv/bin/python scripts/report_screenshots.py OUT_DIR --make RUNS_DIR [--emu]
      first make one directory of each kind in RUNS_DIR (sim lightpaths, sim jobs, a sweep,
      each reproduction on its quick settings; with --emu, as root, the quickstart
      emulation and a run on both backends, a few minutes each), then screenshot them all
Screenshots: OUT_DIR/NAME-top.png and OUT_DIR/NAME-full.png."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

log = logging.getLogger("report_screenshots")

REPRODUCTIONS = {"crosspipe": ["time_limit_s=2"], "geopipe": [],
                 "cba": ["seeds=2", "jobs=30"], "bace": ["seeds=2", "jobs=25"],
                 "routing": ["seeds=2"]}


def make_runs(runs: Path, emu: bool) -> list[str]:
    """One directory of each report kind under runs; NAME=DIR items."""
    from testbed.cli.main import main

    runs.mkdir(parents=True, exist_ok=True)
    spec = yaml.safe_load((REPO / "scenarios" / "quickstart.yaml").read_text())
    spec["workload"]["requests"] = 2000
    small = runs / "quickstart-2000.yaml"
    small.write_text(yaml.safe_dump(spec))
    made = {"sim": ["sim", str(small)],
            "sim-jobs": ["sim", str(REPO / "scenarios" / "pp-jobs.yaml")],
            "sweep": ["sweep", str(small), "--set", "workload.load_erlang=5,10,20", "--set",
                      "policy.spectrum=first_fit,best_fit", "--seeds", "2"]}
    for name, sets in REPRODUCTIONS.items():
        made[name] = ["reproduce", name, "--quick", *[a for s in sets for a in ("--set", s)]]
    if emu:
        spec["emulation"]["max_requests"] = 20
        emu_spec = runs / "quickstart-emu.yaml"
        emu_spec.write_text(yaml.safe_dump(spec))
        made["emu"] = ["emu", str(emu_spec), "--probe-seconds", "1"]
        made["both"] = ["run", str(emu_spec), "--backend", "both"]
    items = []
    for name, argv in made.items():
        out = runs / name
        code = main([*argv, "--out", str(out), "--force", "-q"])
        if code != 0:
            log.error("%s: exit %d, not screenshot", name, code)
            continue
        items.append(f"{name}={out}")
    return items


def main(argv: list[str]) -> int:
    import browser

    from testbed.report.build import build_report

    if len(argv) >= 3 and argv[1] == "--make":
        items = make_runs(Path(argv[2]), "--emu" in argv[3:])
    elif len(argv) >= 2 and all("=" in a for a in argv[1:]):
        items = argv[1:]
    else:
        print(__doc__, file=sys.stderr)
        return 2
    if not browser.available():
        print("needs chromium, chromium-driver and selenium (scripts/setup.sh)", file=sys.stderr)
        return 1
    out = Path(argv[0])
    for item in items:
        name, _, run_dir = item.partition("=")
        page = build_report(run_dir)
        check = browser.inspect(page, out, name)
        broken = [i for i in check.images if not i["loaded"]]
        print(f"{name}: {len(check.images)} figures ({len(broken)} broken), "
              f"{len(check.console)} console entries; "
              + ", ".join(str(s) for s in check.screenshots))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.exit(main(sys.argv[1:]))
