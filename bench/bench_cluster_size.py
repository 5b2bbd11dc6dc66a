"""The largest network `lightpipe cluster up` holds in the RTT band: one machine against several.

    # in the two Vagrant guests (issue 24; about 60 minutes under software emulation):
    sudo bash tests/vm/cluster.sh --cmd ".venv/bin/python bench/bench_cluster_size.py \\
        --json /var/tmp/lp-cluster-size.json"
    # any cluster file, chosen machine sets and sizes:
    sudo .venv/bin/python bench/bench_cluster_size.py --cluster my.yaml --set a --set a,b \\
        --size nsfnet:4:2 --size nsfnet:14:2 --size usnet:24:2

For each machine set (a subset of the cluster file's machines, in order) and each size
(TOPOLOGY:DCS:HOSTS: the library topology with a DC on its first DCS nodes, HOSTS hosts
each), smallest first: `lightpipe cluster up` with the delay calibration and its rechecks
(the links and datapath `auto`: netem and the kernel datapath where the kernel has them),
then `lightpipe cluster down`. A size is *held* when every machine came up, every DC pair
answered and every pair's RTT is within 2 x delay +- 1 ms of the plan. The first size a
set does not hold ends that set's ladder (--all goes on), so the table gives, per set,
the largest size held and where the next one failed, with each run's times (every
machine's share up, the calibration, the pair check), its RTT errors and each machine's
memory in use while the network was up.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
log = logging.getLogger("bench_cluster_size")

DEFAULT_SIZES = ("nsfnet:4:2", "nsfnet:8:2", "nsfnet:14:2", "usnet:24:2")
SIZE_RE = re.compile(r"([a-z0-9]+):([0-9]{1,3}):([0-9]{1,2})")
RUN_RE = re.compile(r"as run (lp[0-9a-f]{4})")
MEMINFO = "awk '/^MemTotal:/{t=$2} /^MemAvailable:/{a=$2} END{print t, a}' /proc/meminfo"


def scenario(topology: str, dcs: int, hosts: int, time_factor: float = 1.0
             ) -> dict[str, Any]:
    """The library topology with a DC on each of its first `dcs` nodes (by id order)."""
    from testbed.topologies import load_library

    nodes = list(load_library(topology).nodes)
    if dcs > len(nodes):
        raise SystemExit(f"--size {topology}:{dcs}: {topology} has {len(nodes)} nodes")
    return {"version": 1, "name": f"{topology}-{dcs}x{hosts}",
            "topology": {"library": topology},
            "dcs": [{"name": f"dc-{n}", "node": str(n), "gpus": 8} for n in nodes[:dcs]],
            "workload": {"kind": "lightpath_requests"},
            "emulation": {"bandwidth_divisor": 10000, "hosts_per_dc": hosts,
                          "forwarding": "static", "time_factor": time_factor}}


def memory_mb(cluster: Any, names: list[str]) -> dict[str, float | None]:
    """Each machine's memory in use (MemTotal - MemAvailable), over the cluster's SSH."""
    from testbed.cluster.remote import Ssh

    out: dict[str, float | None] = {}
    for m in cluster.machines:
        if m.name not in names:
            continue
        res = Ssh(cluster, m).run_script(MEMINFO, [], 30.0)
        words = res.stdout.split()
        out[m.name] = (round((int(words[0]) - int(words[1])) / 1024, 1)
                       if res.returncode == 0 and len(words) == 2 else None)
    return out


def lightpipe(*argv: str, timeout_s: float) -> tuple[int, str]:
    """`lightpipe ARGV` of this checkout; (status, stdout + stderr)."""
    cmd = [sys.executable, "-c", "import sys; from testbed.cli.main import entry; "
           "sys.exit(entry())", *argv]
    try:
        res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                             timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        return 124, f"{exc.stdout or ''}{exc.stderr or ''}\n(timed out after {timeout_s:g} s)"
    return res.returncode, res.stdout + res.stderr


def one_run(cluster: Any, subset: Path, names: list[str], size: str, work: Path,
            ready_timeout_s: int, time_factor: float = 1.0) -> dict[str, Any]:
    """`cluster up` then `cluster down` of one size on one machine set: its row."""
    topo, dcs, hosts = SIZE_RE.fullmatch(size).groups()  # type: ignore[union-attr]
    tag = f"{topo}-{dcs}x{hosts}" + (f"-tf{time_factor:g}" if time_factor != 1.0 else "")
    spec = work / f"{tag}.yaml"
    spec.write_text(yaml.safe_dump(scenario(topo, int(dcs), int(hosts), time_factor),
                                   sort_keys=False))
    out = work / f"{'+'.join(names)}-{tag}"
    row: dict[str, Any] = {"machines": names, "size": size, "dcs": int(dcs),
                           "hosts_per_dc": int(hosts), "time_factor": time_factor,
                           "load_before": os.getloadavg()[0],
                           "memory_before_mb": memory_mb(cluster, names)}
    t0 = time.monotonic()
    code, text = lightpipe("cluster", "up", str(spec), "--cluster", str(subset), "--out",
                           str(out), "--ready-timeout", str(ready_timeout_s),
                           timeout_s=4 * ready_timeout_s + 1800)
    row["up_wall_s"] = round(time.monotonic() - t0, 1)
    row["memory_up_mb"] = memory_mb(cluster, names)
    row["load_up"] = os.getloadavg()[0]
    m = RUN_RE.search(text)
    if code != 0:
        row["failure"] = (text.strip().splitlines() or ["(no output)"])[-1]
    if m is not None:
        dcode, dtext = lightpipe("cluster", "down", "--cluster", str(subset), m.group(1),
                                 timeout_s=600)
        row["down_ok"] = dcode == 0
        if dcode != 0:
            row["down_failure"] = (dtext.strip().splitlines() or ["(no output)"])[-1]
    (out / "console.txt").parent.mkdir(parents=True, exist_ok=True)
    (out / "console.txt").write_text(text)
    try:
        rec = json.loads((out / "cluster_run.json").read_text())
        rtt = json.loads((out / "cluster_rtt.json").read_text())
    except (OSError, ValueError) as exc:
        row.setdefault("failure", f"no records: {exc}")
        row["held"] = False
        return row
    cal: dict[str, Any] = {}
    try:
        cal = json.loads((out / "cluster_calibration.json").read_text())
    except (OSError, ValueError):
        pass
    try:  # the lightpath probes across the machines (cluster up's last check)
        lp = json.loads((out / "cluster_probes.json").read_text())
        row["probes"] = {"directions": len(lp["probes"]),
                         "on_route": sum(bool(r["route_ok"]) for r in lp["probes"]),
                         "in_time": sum(bool(r["delay_ok"]) for r in lp["probes"]),
                         "rounds": lp["rounds"], "took_s": lp["took_s"]}
    except (OSError, ValueError, KeyError):
        row["probes"] = None
    # in scenario time: emulated RTT error / time factor (the band is +-1 ms emulated)
    errs = [(r["median_ms"] - r["expected_rtt_ms"]) / time_factor for r in rtt["pairs"]
            if r.get("median_ms") is not None]
    row |= {"up_s": rec["up_s"], "crossing_fibres": rec["crossing_fibres"],
            "share_up_s": {k: v.get("up_s") for k, v in rec["machines"].items()},
            "share_hosts": {k: len(v.get("hosts") or {}) for k, v in rec["machines"].items()},
            "link_mode": sorted({str(v.get("link_mode")) for v in rec["machines"].values()}),
            "datapath": sorted({str(v.get("datapath")) for v in rec["machines"].values()}),
            "pairs": rtt["pairs_planned"], "answered": rtt["pairs_answered"],
            "in_band": rtt["pairs_within_band"], "rechecks": len(rtt["rtt_rechecks"]),
            "check_s": rtt["took_s"], "calibration_s": cal.get("wall_s"),
            "error_ms": {"median": round(statistics.median(errs), 3),
                         "worst": round(max(errs, key=abs), 3)} if errs else {},
            "out_of_band": [r["pair"] for r in rtt["pairs"] if not r.get("within_band")]}
    row["held"] = ("failure" not in row and row["answered"] == row["pairs"]
                   and row["in_band"] == row["pairs"])
    return row


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| machines | size (DCs x hosts) | pairs in band | RTT error median / worst | "
            "up (each share) | calibration | pair check | lightpath probes on route / in "
            "time | memory in use while up | held |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        shares = ", ".join(f"{k} {v:.0f} s" for k, v in (r.get("share_up_s") or {}).items()
                           if v is not None)
        mem = ", ".join(f"{k} {v:.0f} MB" for k, v in r["memory_up_mb"].items()
                        if v is not None)
        err = r.get("error_ms") or {}
        lines.append(
            f"| {'+'.join(r['machines'])} | {r['size']} | "
            f"{r.get('in_band', 0)}/{r.get('pairs', '?')} | "
            + (f"{err['median']:+.2f} / {err['worst']:+.2f} ms" if err else "-")
            + f" | {r.get('up_s', 0):.0f} s ({shares}) | "
            + (f"{r['calibration_s']:.0f} s" if r.get("calibration_s") else "-")
            + f" | {r.get('check_s', 0):.0f} s | "
            + (f"{pr['on_route']}/{pr['directions']} / {pr['in_time']} ({pr['took_s']:.0f} s)"
               if (pr := r.get("probes")) else "-")
            + f" | {mem} | "
            + ("yes" if r["held"] else f"no: {r.get('failure') or r.get('out_of_band')}")
            + " |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cluster", default=str(REPO / "vagrant/cluster/cluster.yaml"))
    ap.add_argument("--set", action="append", dest="sets", default=None,
                    help="machines (comma-separated, a subset of the cluster file's, in "
                         "order; the first runs the controller); default: the first "
                         "machine, then all")
    ap.add_argument("--size", action="append", dest="sizes", default=None,
                    help="TOPOLOGY:DCS:HOSTS, smallest first (default: "
                         + ", ".join(DEFAULT_SIZES) + ")")
    ap.add_argument("--all", action="store_true", help="run every size, held or not")
    ap.add_argument("--time-factor", type=float, default=1.0,
                    help="emulation.time_factor of every run (a number: cluster runs do not "
                         "choose `auto`); errors are printed in scenario time")
    ap.add_argument("--ready-timeout", type=int, default=900)
    ap.add_argument("--work", default="/var/tmp/lp-cluster-size")
    ap.add_argument("--json", help="write the rows here (atomically)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from testbed.cluster.spec import load_cluster
    from testbed.io.atomic import atomic_write_json

    cluster = load_cluster(args.cluster)
    every = list(cluster.machine_names)
    sets = [s.split(",") for s in args.sets] if args.sets else [every[:1], every]
    sizes = args.sizes or list(DEFAULT_SIZES)
    for s in sizes:
        if not SIZE_RE.fullmatch(s):
            raise SystemExit(f"--size {s!r}: expected TOPOLOGY:DCS:HOSTS, e.g. nsfnet:14:2")
    for names in sets:
        if not names or any(n not in every for n in names):
            raise SystemExit(f"--set {','.join(names)}: machines are {', '.join(every)}")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for names in sets:
        data = yaml.safe_load(Path(args.cluster).read_text())
        data["machines"] = [m for m in data["machines"] if m["name"] in names]
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", dir=work, delete=False) as fh:
            yaml.safe_dump(data, fh)
            subset = Path(fh.name)
        for size in sizes:
            log.info("bench_cluster_size: %s on %s ...", size, "+".join(names))
            row = one_run(cluster, subset, names, size, work, args.ready_timeout,
                          args.time_factor)
            rows.append(row)
            log.info("bench_cluster_size: %s on %s: %s", size, "+".join(names),
                     json.dumps({k: row.get(k) for k in ("held", "in_band", "pairs", "up_s",
                                                         "error_ms", "failure")}))
            if args.json:
                atomic_write_json(Path(args.json), {"rows": rows})
            if not row["held"] and not args.all:
                break
    print(table(rows))
    for names in sets:
        held = [r["size"] for r in rows if r["machines"] == names and r["held"]]
        log.info("largest held on %s: %s", "+".join(names), held[-1] if held else "none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
