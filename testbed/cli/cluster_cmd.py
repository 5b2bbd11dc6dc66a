"""`lightpipe cluster check|up|down --cluster FILE`: placement, crossing fibres, tunnels
and every machine checked; a scenario's network brought up across the machines, checked
pair by pair and held, and taken down; and the report of `lightpipe clean --cluster FILE`
(run_clean)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

HELP = ("emulation across machines: check a cluster file (placement, tunnels, SSH, tools), "
        "bring a scenario's network up across the machines and take it down")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="cluster_action", metavar="ACTION", required=True)
    check = sub.add_parser("check", help="print where each DC would run, the fibres that "
                           "cross machines with their tunnels, and check every machine "
                           "over SSH (reachable; ip, tc, ovs-vswitchd, ovs-vsctl, mnexec, "
                           "the venv, root or sudo, vxlan)")
    check.add_argument("spec", nargs="?", metavar="SPEC",
                       help="scenario file (YAML) to place; without it only the machines "
                       "are checked")
    check.add_argument("--cluster", metavar="FILE", required=True,
                       help="cluster file (YAML): machines, ssh, venv, tunnel "
                       "(docs/cluster.md)")
    check.add_argument("--place", action="append", default=[], metavar="DC=MACHINE",
                       help="put a DC (with its ROADM) on a machine (repeatable)")
    check.add_argument("--offline", action="store_true",
                       help="placement and tunnels only: do not contact the machines")
    check.add_argument("--prefix", metavar="RUN", default=None,
                       help="run prefix for the tunnel names (lpXXXX; default: a new one)")
    check.add_argument("--json", action="store_true", help="print one JSON document")
    up = sub.add_parser("up", help="bring SPEC's network up across the machines (each "
                        "machine's share over SSH), ping every DC pair, and hold it until "
                        "`cluster down`")
    up.add_argument("spec", metavar="SPEC", help="scenario file (YAML)")
    up.add_argument("--cluster", metavar="FILE", required=True, help="cluster file (YAML)")
    up.add_argument("--out", metavar="DIR", required=True,
                    help="where cluster_run.json and cluster_rtt.json are written")
    up.add_argument("--place", action="append", default=[], metavar="DC=MACHINE",
                    help="put a DC (with its ROADM) on a machine (repeatable)")
    up.add_argument("--prefix", metavar="RUN", default=None,
                    help="run prefix (lpXXXX; default: a new one)")
    up.add_argument("--link-mode", choices=("auto", "userspace", "netem"), default="auto",
                    help="fibre emulators on every machine (as `emu --link-mode`)")
    up.add_argument("--datapath", choices=("auto", "user", "kernel"), default="auto",
                    help="Open vSwitch datapath on every machine")
    up.add_argument("--ready-timeout", type=float, default=600.0, metavar="S",
                    help="how long a machine may take to bring its share up (s)")
    up.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                    help="leave the fibres' delays as planned (default: calibrate them "
                    "across the machines, tunnels included, as `emu` does on one)")
    down = sub.add_parser("down", help="take a run's shares down on every machine (stop, "
                          "then that machine's own `lightpipe clean RUN`)")
    down.add_argument("prefix", metavar="RUN", help="the run prefix `cluster up` printed")
    down.add_argument("--cluster", metavar="FILE", required=True, help="cluster file (YAML)")
    st = sub.add_parser("status", help="list what every machine holds: each run's share, "
                        "its holder alive or not, its processes, hosts and tunnels")
    st.add_argument("--cluster", metavar="FILE", required=True, help="cluster file (YAML)")
    st.add_argument("--json", action="store_true", help="print the record as JSON")
    parser.set_defaults(cluster_action=None)


def run(args: argparse.Namespace) -> int:
    from testbed.cli.common import emit, emit_json
    from testbed.cluster.spec import load_cluster
    from testbed.errors import InputError, RuntimeFailure

    if args.cluster_action == "up":
        return run_up(args)
    if args.cluster_action == "down":
        return run_down(args)
    if args.cluster_action == "status":
        return run_status(args)
    if args.cluster_action != "check":
        raise InputError("ACTION", "expected check, up, down or status")
    cluster = load_cluster(args.cluster)
    doc: dict[str, Any] = {"cluster": cluster.name,
                           "machines": list(cluster.machine_names)}
    if args.spec:
        doc.update(_placement(args, cluster))
    elif args.place:
        raise InputError("--place", "needs a SPEC to place")
    checks = []
    if not args.offline:
        from testbed.cluster.remote import check_cluster

        checks = check_cluster(cluster)
        doc["checks"] = [{"machine": c.machine, "address": c.address, "ok": c.ok,
                          "problems": c.problems, "tools": c.tools, "root": c.root,
                          "underlay_dev": c.underlay_dev, "underlay_mtu": c.underlay_mtu,
                          "kernel": c.kernel} for c in checks]
    if args.json:
        emit_json(doc)
    else:
        for line in _lines(doc, checks):
            emit(line)
    bad = [c for c in checks if not c.ok]
    if bad:
        more = f" (and {len(bad) - 1} more machine(s), listed above)" if len(bad) > 1 else ""
        raise RuntimeFailure(f"machine {bad[0].machine} ({bad[0].address}): "
                             f"{'; '.join(bad[0].problems)}{more}")
    return 0


def _placement(args: argparse.Namespace, cluster: Any) -> dict[str, Any]:
    from dataclasses import asdict

    from testbed.cluster.place import parse_overrides, place
    from testbed.cluster.tunnel import plan_tunnels
    from testbed.emu.plan import build_plan
    from testbed.emu.state import PREFIX_RE
    from testbed.errors import InputError
    from testbed.spec import load_scenario

    if args.prefix is not None and not PREFIX_RE.fullmatch(args.prefix):
        raise InputError("--prefix", f"not a run prefix: {args.prefix!r} (lp + 4 hex digits)")
    scenario = load_scenario(args.spec)
    plan = build_plan(scenario, args.prefix)
    overrides = parse_overrides(args.place, [d.name for d in scenario.dcs],
                                cluster.machine_names)
    placement = place(scenario, plan, cluster.machine_names, overrides)
    roadm = {s.label: s.node for s in plan.switches if s.kind == "roadm"}
    tunnels = plan_tunnels(plan.prefix, placement, cluster, roadm)
    return {
        "scenario": scenario.name, "prefix": plan.prefix, "services": placement.services,
        "dcs": placement.dc_machine,
        "load": {m: asdict(v) for m, v in placement.load.items()},
        "crossing": [asdict(c) for c in placement.crossing],
        "tunnels": [asdict(t) | {"fragments": t.fragments} for t in tunnels],
    }


def _lines(doc: dict[str, Any], checks: list[Any]) -> list[str]:
    out = [f"cluster {doc['cluster']}: {len(doc['machines'])} machine(s): "
           + ", ".join(doc["machines"])]
    if "dcs" in doc:
        out.append(f"scenario {doc['scenario']} (run prefix {doc['prefix']}); controller "
                   f"and monitor on {doc['services']}")
        for m in doc["machines"]:
            load = doc["load"][m]
            dcs = sorted(d for d, x in doc["dcs"].items() if x == m)
            out.append(f"  {m}: {load['dcs']} DC(s) {', '.join(dcs) or '-'}; "
                       f"{load['hosts']} hosts, {load['gpus']} GPUs, {load['switches']} "
                       f"switches, {load['fibre_emulators']} fibre emulators")
        out.append(f"crossing fibres: {len(doc['crossing'])}")
        for t in doc["tunnels"]:
            a, b = t["a"], t["b"]
            frag = (f", {t['outer_bytes']} > underlay mtu {t['underlay_mtu']}: fragmented"
                    if t["fragments"] else "")
            out.append(f"  fibre {t['u']}-{t['v']}: {a['machine']} -> {b['machine']}, "
                       f"vxlan {a['device']} vni {t['vni']} udp {t['udp_port']}, "
                       f"{a['local_ip']} <-> {b['local_ip']}, mtu {t['device_mtu']}, "
                       f"outer {t['outer_bytes']} bytes{frag}")
    for c in checks:
        out.append(f"check {c.line()}")
    return out


def run_clean(args: argparse.Namespace) -> int:
    """`lightpipe clean --cluster FILE [RUN...] [--dry-run] [--force]`: every machine's
    lines prefixed by its name, then one line per machine; exit 1 naming the first
    machine that was not cleaned (the others were)."""
    from testbed.cli.common import emit
    from testbed.cluster.cleanup import clean_cluster
    from testbed.cluster.spec import load_cluster
    from testbed.errors import InputError, RuntimeFailure

    if args.dir:
        raise InputError("--dir", "not with --cluster (output directories are cleaned on "
                         "the machine that wrote them)")
    cluster = load_cluster(args.cluster)
    results = clean_cluster(cluster, args.prefix, args.dry_run, args.force)
    for r in results:
        for line in r.lines:
            emit(f"{r.machine}: {line}")
    for r in results:
        emit(f"clean {r.line(args.dry_run)}")
    bad = [r for r in results if not r.ok]
    if bad:
        more = f" (and {len(bad) - 1} more machine(s), listed above)" if len(bad) > 1 else ""
        raise RuntimeFailure(f"machine {bad[0].machine} ({bad[0].address}): "
                             f"{bad[0].problem}{more}")
    return 0


def run_up(args: argparse.Namespace) -> int:
    """`lightpipe cluster up`: plan once, start every machine's share, ping every DC pair,
    probe every lightpath, write DIR/cluster_run.json, DIR/cluster_rtt.json and
    DIR/cluster_probes.json; hold (the shares run on)."""
    from pathlib import Path

    from testbed.cli.common import check_out, emit
    from testbed.cluster.spec import load_cluster
    from testbed.io.trusted import make_dirs
    from testbed.spec import load_scenario

    check_up_args(args)
    cluster = load_cluster(args.cluster)
    scenario = load_scenario(args.spec)
    check_out(args.out)
    up = bring_up(args, cluster, scenario, lambda: make_dirs(Path(args.out)))
    emit(f"cluster up: holding run {up.plan.prefix}; `lightpipe cluster down --cluster "
         f"{args.cluster} {up.plan.prefix}` takes it down")
    return 0


def check_up_args(args: argparse.Namespace) -> None:
    """--prefix and --ready-timeout (InputError naming the option)."""
    from testbed.emu.state import PREFIX_RE
    from testbed.errors import InputError

    if args.prefix is not None and not PREFIX_RE.fullmatch(args.prefix):
        raise InputError("--prefix", f"not a run prefix: {args.prefix!r} (lp + 4 hex digits)")
    if not 1 <= args.ready_timeout <= 3600:
        raise InputError("--ready-timeout", "between 1 and 3600 s")


@dataclass
class UpRun:
    """A scenario's network up across the machines: the plan, where each part runs, what
    each machine answered, the delay calibration."""

    cluster: Any
    scenario: Any
    plan: Any
    placement: Any
    shares: dict[str, Any]
    machines: list[str]            # those that hold a share
    record: dict[str, Any]         # cluster_run.json
    calibration: dict[str, Any]
    rtt_path: Any = None
    probes: dict[str, Any] | None = None   # cluster_probes.json

    def down(self) -> list[Any]:
        from testbed.cluster.drive import down_shares

        return down_shares(self.cluster, self.plan.prefix,
                           [m for m in self.cluster.machines if m.name in self.machines])


def bring_up(args: argparse.Namespace, cluster: Any, scenario: Any,
             make_out: Callable[[], Any]) -> UpRun:
    """Plan, start every machine's share, calibrate and check every DC pair (records in
    the directory `make_out()` returns, once the input is checked). On a failure every
    machine reached is taken down and RuntimeFailure names the first machine or pair."""
    import time
    from pathlib import Path

    from testbed.cli.common import emit
    from testbed.cluster.drive import up_shares
    from testbed.cluster.place import parse_overrides
    from testbed.cluster.remote import check_ssh_inputs
    from testbed.cluster.sharedoc import pair_probes, plan_cluster, share_doc
    from testbed.errors import RuntimeFailure
    from testbed.io.atomic import atomic_write_json

    overrides = parse_overrides(args.place, [d.name for d in scenario.dcs],
                                cluster.machine_names)
    plan, placement, shares = plan_cluster(scenario, cluster, args.prefix, overrides)
    docs = {m: share_doc(scenario, cluster, plan, placement, m, args.link_mode,
                         args.datapath)
            for m, sh in shares.items() if sh.node_names()}
    for m in cluster.machines:
        check_ssh_inputs(cluster, m)
    out = make_out()
    emit(f"cluster up: {scenario.name} as run {plan.prefix} on {len(docs)} machine(s)")
    from testbed.emu.scale import Scale

    if Scale.is_auto(scenario.emulation):
        emit(f"note: emulation.time_factor auto is not chosen across machines yet: this run "
             f"uses {plan.scale.time_factor:g} (set a number to choose it; docs/scale.md)")
    t0 = time.monotonic()
    started, downs = up_shares(cluster, plan.prefix, docs, args.ready_timeout)
    up_s = time.monotonic() - t0
    for r in started:
        if r.ok and r.ready is not None:
            dcs = sorted({h["dc"] for h in r.ready["hosts"].values()})
            emit(f"up {r.head()}: ok, share up in {r.ready['up_s']:.2f} s ({len(dcs)} DC(s) "
                 f"{', '.join(dcs)}; {len(r.ready['hosts'])} hosts; "
                 f"{len(r.ready['tunnels'])} tunnel end(s))")
        else:
            emit(f"up {r.head()}: {r.problem}")
    bad_up = [r for r in started if not r.ok]
    if bad_up:
        _report_down(downs)
        bad = bad_up[0]
        raise RuntimeFailure(f"machine {bad.machine} ({bad.address}): {bad.problem}")
    record = {"prefix": plan.prefix, "scenario": scenario.name, "cluster": cluster.name,
              "cluster_file": str(Path(args.cluster).resolve()),
              "services": placement.services, "dcs": dict(placement.dc_machine),
              "crossing_fibres": len(placement.crossing), "up_s": round(up_s, 3),
              "machines": {r.machine: {"address": r.address, **(r.ready or {})}
                           for r in started}}
    atomic_write_json(out / "cluster_run.json", record)
    emit(f"cluster up: all {len(started)} machine(s) up in {up_s:.2f} s; "
         f"{out}/cluster_run.json written")
    up = UpRun(cluster, scenario, plan, placement, shares, sorted(docs), record,
               {"enabled": False})
    probes = pair_probes(plan, placement)
    failure = ""
    if args.calibrate:
        try:
            up.calibration = _calibrate(cluster, plan, shares, probes, record, out)
        except RuntimeFailure as exc:
            failure = f"delay calibration: {exc}"
    if not failure:
        failure = _check_and_recheck(up, probes, record, out)
    if not failure:
        failure = probe_lightpaths(up, out)
    if failure:
        emit(f"cluster up: taking run {plan.prefix} down")
        _report_down(up.down())
        raise RuntimeFailure(failure)
    up.rtt_path = out / "cluster_rtt.json"
    return up


def probe_lightpaths(up: UpRun, out: Any, name: str = "cluster_probes.json") -> str:
    """Every lightpath direction probed across the machines (testbed.cluster.lpprobe),
    as a one-machine verification probes them; DIR/NAME written; a probe off its route
    fails (its line), one outside its fibres' delays is recorded and warned about."""
    from concurrent.futures import ThreadPoolExecutor

    from testbed.cli.common import emit
    from testbed.cluster.lpprobe import probe_words, run_probes
    from testbed.errors import RuntimeFailure
    from testbed.io.atomic import atomic_write_json

    step = probe_step(up.cluster, up.plan.prefix)

    def side_by_side(ms: Any, fn: Any) -> list[Any]:
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(ms)))) as pool:
            return list(pool.map(fn, ms))

    try:
        rec = run_probes(up.plan, up.placement, step, side_by_side)
    except RuntimeFailure as exc:
        return f"lightpath probes: {exc}"
    rec["note"] = ("each fibre's delay from kernel stamps in its middle node (one machine's "
                   "clock); the route on every machine; the one-way time only where both "
                   "hosts share a machine (one_way_checked)")
    atomic_write_json(out / name, rec)
    up.probes = rec
    rows = rec["probes"]
    for row in rows:
        if not row["ok"]:
            emit(f"  {'warning: ' if row['route_ok'] else ''}{probe_words(row)}")
    emit(f"cluster check: {sum(r['route_ok'] for r in rows)}/{len(rows)} lightpath probes "
         f"on their routes, {sum(r['delay_ok'] for r in rows)} within their fibres' delays "
         f"(one way checked on {rec['one_way_checked']}; {rec['rounds']} round(s), "
         f"{rec['took_s']:.1f} s); {out}/{name} written")
    off = [r for r in rows if not r["route_ok"]]
    if off:
        return f"lightpath probe(s) off their route: {probe_words(off[0])}"
    return ""


def probe_step(cluster: Any, prefix: str) -> Any:
    """(machine, request) -> the holder's reply, over SSH (`hold correct`); RuntimeFailure
    naming the machine when the step fails."""
    import json

    from testbed.cluster.drive import run_step
    from testbed.errors import RuntimeFailure

    machines = {m.name: m for m in cluster.machines}

    def step(machine: str, req: dict[str, Any]) -> dict[str, Any]:
        r = run_step(cluster, machines[machine], "correct", prefix,
                     stdin=json.dumps(req).encode(), timeout_s=90.0)
        if not r.ok or not r.rows:
            raise RuntimeFailure(f"machine {r.machine} ({r.address}): "
                                 f"{r.problem or 'no reply from its holder'}")
        return r.rows[-1]

    return step


def machine_steps(cluster: Any, prefix: str) -> tuple[Any, Any]:
    """(apply, ping) of testbed.cluster.calib over SSH: a correction request to one
    machine's share holder (`hold correct`: its fibres' states back), and probes pinged
    from the machines of their first DCs (their rtt rows); RuntimeFailure naming the
    machine."""
    import json

    from testbed.cluster.drive import ping_pairs, run_step
    from testbed.errors import RuntimeFailure

    machines = {m.name: m for m in cluster.machines}

    def apply(machine: str, req: dict[str, Any]) -> dict[str, Any]:
        r = run_step(cluster, machines[machine], "correct", prefix,
                     stdin=json.dumps(req).encode(), timeout_s=120.0)
        if not r.ok or r.fibres is None:
            raise RuntimeFailure(f"machine {r.machine} ({r.address}): "
                                 f"{r.problem or 'no fibre states'}")
        return r.fibres

    def ping(asked: Any) -> list[dict[str, Any]]:
        results = ping_pairs(cluster, prefix, asked)
        bad = [r for r in results if not r.ok and not r.rows]
        if bad:
            raise RuntimeFailure(f"machine {bad[0].machine} ({bad[0].address}): "
                                 f"{bad[0].problem}")
        return [row for r in results for row in r.rows]

    return apply, ping


def _calibrate(cluster: Any, plan: Any, shares: dict[str, Any], probes: list[Any],
               record: dict[str, Any], out: Any) -> dict[str, Any]:
    """Calibrate the fibres' delays across the machines (testbed.cluster.calib); write
    DIR/cluster_calibration.json; the record (RuntimeFailure naming a machine)."""
    from testbed.cli.common import emit
    from testbed.cluster.calib import calibrate_cluster
    from testbed.emu.calibrate import CalibrationConfig
    from testbed.io.atomic import atomic_write_json

    modes = {str(m.get("link_mode")) for m in record["machines"].values()}
    cfg = CalibrationConfig.for_link_mode("netem" if "netem" in modes else "userspace")
    apply, ping = machine_steps(cluster, plan.prefix)
    fibre_machine = {f.middle: m for m, sh in shares.items() for f in sh.fibres}
    cal = calibrate_cluster(plan, fibre_machine, probes, apply, ping, cfg)
    cal["link_modes"] = sorted(modes)
    atomic_write_json(out / "cluster_calibration.json", cal)
    worst = max((abs(float(r["error_ms"])) for r in cal["after"]), default=0.0)
    emit(f"cluster up: delay calibration ({cal['mode']}): {cal['corrections_applied']} "
         f"correction round(s) in {cal['wall_s']:.1f} s, "
         f"{'settled' if cal['settled'] else 'not settled'}, worst pair "
         f"{worst:.3f} ms off the plan; {out}/cluster_calibration.json written")
    return cal


def _check_and_recheck(up: UpRun, probes: list[Any], record: dict[str, Any], out: Any
                       ) -> str:
    """Ping every DC pair; pairs outside the RTT band after the calibration: calibrate
    again and ping again, up to RTT_RECHECKS times, as a one-machine run's verification
    does (the processing time of emulated paths drifts, the more so under software
    emulation); the first failure's line or ''. Still outside: recorded, not failed."""
    from testbed.cli.common import emit
    from testbed.emu.delaycal import RTT_TOL_MS
    from testbed.errors import RuntimeFailure
    from testbed.orchestrate.run import RTT_RECHECKS

    rechecks: list[dict[str, Any]] = []
    tol = up.plan.scale.delay_ms(RTT_TOL_MS)
    failure, doc = check_pairs(up.cluster, up.plan.prefix, probes, out, up.calibration,
                               tol_ms=tol)
    while (not failure and up.calibration.get("enabled") and len(rechecks) < RTT_RECHECKS
           and doc["pairs_within_band"] < doc["pairs_planned"]):
        outside = [str(r["pair"]) for r in doc["pairs"]
                   if r.get("pings") and not r.get("within_band")]
        emit(f"cluster up: {len(outside)} DC pair(s) outside the RTT band after the "
             f"calibration ({', '.join(outside)}): calibrating again")
        try:
            up.calibration = _calibrate(up.cluster, up.plan, up.shares, probes, record, out)
        except RuntimeFailure as exc:
            return f"delay calibration: {exc}"
        rechecks.append({"out_of_band": outside,
                         "calibration_settled": bool(up.calibration.get("settled")),
                         "corrections_applied": up.calibration.get("corrections_applied")})
        failure, doc = check_pairs(up.cluster, up.plan.prefix, probes, out, up.calibration,
                                    rechecks, tol_ms=tol)
    return failure


def check_pairs(cluster: Any, prefix: str, probes: list[Any], out: Any,
                 calibration: dict[str, Any] | None = None,
                 rechecks: list[dict[str, Any]] | None = None,
                 name: str = "cluster_rtt.json", tol_ms: float | None = None
                 ) -> tuple[str, dict[str, Any]]:
    """Ping every DC pair; write DIR/NAME; (the first failure's line or '', the record
    written). tol_ms: the band (emulated ms; default RTT_TOL_MS): the plan's
    `scale.delay_ms(RTT_TOL_MS)`, so that it is +-1 ms in scenario time as on one machine."""
    import time

    from testbed.cli.common import emit
    from testbed.cluster.drive import ping_pairs
    from testbed.emu.delaycal import RTT_TOL_MS
    from testbed.io.atomic import atomic_write_json

    tol = RTT_TOL_MS if tol_ms is None else tol_ms
    t0 = time.monotonic()
    results = ping_pairs(cluster, prefix, probes)
    rows = pair_rows(results, probes, tol)
    answered = [row for row in rows if row.get("pings")]
    calibrated = bool(calibration and calibration.get("enabled"))
    doc = {"prefix": prefix, "tolerance_ms": round(tol, 4), "pairs_planned": len(probes),
           "pairs_answered": len(answered),
           "pairs_within_band": sum(1 for row in answered if row.get("within_band")),
           "took_s": round(time.monotonic() - t0, 3),
           "calibrated": calibrated,
           "calibration_settled": bool(calibration.get("settled")) if calibrated
           and calibration else None,
           "note": ("RTT against the plan's 2 x one-way delay, after the delay calibration "
                    "across machines (cluster_calibration.json)" if calibrated else
                    "RTT against the plan's 2 x one-way delay; not calibrated "
                    "(--no-calibrate: the network between the machines adds)"),
           "rtt_rechecks": list(rechecks or []),
           "pairs": rows}
    atomic_write_json(out / name, doc)
    for row in rows:
        med = row.get("median_ms")
        emit(f"  {row['pair']:<20} {row['src_machine']} -> {row['dst_machine']}: "
             + (f"rtt median {med:.3f} ms vs plan {row['expected_rtt_ms']:.3f} ms "
                f"({row['pings']}/{row['pings_sent']} replies"
                f"{', within band' if row.get('within_band') else ''})"
                if med is not None else "no reply"))
    emit(f"cluster check: {len(answered)}/{len(probes)} DC pairs answered, "
         f"{doc['pairs_within_band']} within the band; {out}/{name} written")
    bad = [r for r in results if not r.ok]
    if bad:
        return f"machine {bad[0].machine} ({bad[0].address}): check: {bad[0].problem}", doc
    if len(answered) != len(probes):
        missing = sorted({p.pair for p in probes} - {str(r["pair"]) for r in answered})
        return f"DC pair(s) without a reply: {', '.join(missing)}", doc
    return "", doc


def pair_rows(results: list[Any], probes: list[Any], tol_ms: float) -> list[dict[str, Any]]:
    """Every machine's ping rows in the probes' order, each with `crosses`, its echoes
    (`samples_ms`, `replies`) and `within_band` judged at tol_ms (the machines judge at
    RTT_TOL_MS emulated; the driver knows the run's scale)."""
    from testbed.emu.delaycal import rtt_ok

    rows = [row | {"crosses": row["src_machine"] != row["dst_machine"]}
            for r in results for row in r.rows]
    order = {p.pair: i for i, p in enumerate(probes)}
    rows.sort(key=lambda row: order.get(str(row.get("pair")), len(order)))
    for row in rows:  # each echo is the calibration's input; the record keeps the sparse
        # pings' echoes as a one-machine verification row does (the fidelity verdict's p99)
        row["samples_ms"] = row.pop("rtts_ms", None) or []
        row["replies"] = len(row["samples_ms"])
        row.pop("dense_rtts_ms", None)
        if row.get("median_ms") is not None:
            row["within_band"] = rtt_ok(row["median_ms"], row["expected_rtt_ms"] / 2, tol_ms)
    return rows


def _report_down(results: list[Any]) -> None:
    from testbed.cli.common import emit

    for r in results:
        for line in r.lines:
            emit(f"{r.machine}: {line}")
    for r in results:
        stopped = dict(r.said).get("stopped")
        emit(f"down {r.head()}: " + (r.problem if not r.ok else
                                     f"ok (share {stopped})" if stopped else "ok"))


def run_down(args: argparse.Namespace) -> int:
    """`lightpipe cluster down --cluster FILE RUN`: on every machine, stop the run's share
    and clean it by its prefix; exit 1 naming the first machine where that failed."""
    from testbed.cluster.drive import down_shares
    from testbed.cluster.spec import load_cluster
    from testbed.emu.state import PREFIX_RE
    from testbed.errors import InputError, RuntimeFailure

    if not PREFIX_RE.fullmatch(args.prefix):
        raise InputError("RUN", f"not a run prefix: {args.prefix!r} (lp + 4 hex digits)")
    cluster = load_cluster(args.cluster)
    results = down_shares(cluster, args.prefix)
    _report_down(results)
    bad = [r for r in results if not r.ok]
    if bad:
        more = f" (and {len(bad) - 1} more machine(s), listed above)" if len(bad) > 1 else ""
        raise RuntimeFailure(f"machine {bad[0].machine} ({bad[0].address}): "
                             f"{bad[0].problem}{more}")
    return 0


def run_status(args: argparse.Namespace) -> int:
    """`lightpipe cluster status --cluster FILE`: per machine, the shares it holds (as its
    own state records them; a run is listed by every machine that holds part of it); exit
    1 naming the first machine that could not be asked."""
    from testbed.cli.common import emit, emit_json
    from testbed.cluster.drive import status_shares
    from testbed.cluster.spec import load_cluster
    from testbed.errors import RuntimeFailure

    cluster = load_cluster(args.cluster)
    results = status_shares(cluster)
    doc: dict[str, Any] = {"cluster": cluster.name, "machines": {}}
    runs: dict[str, list[str]] = {}
    for r in results:
        doc["machines"][r.machine] = ({"address": r.address, "shares": r.rows} if r.ok else
                                      {"address": r.address, "error": r.problem})
        for row in r.rows if r.ok else []:
            runs.setdefault(str(row.get("prefix")), []).append(r.machine)
    doc["runs"] = runs
    if args.json:
        emit_json(doc)
    else:
        for r in results:
            if not r.ok:
                emit(f"{r.head()}: {r.problem}")
                continue
            if not r.rows:
                emit(f"{r.head()}: holds no share")
            for row in r.rows:
                if "error" in row:
                    emit(f"{r.head()}: run {row['prefix']}: {row['error']}")
                    continue
                holder = ("holder alive" if row.get("holder_alive") else
                          "holder GONE (lightpipe clean --cluster FILE)")
                emit(f"{r.head()}: run {row['prefix']} ({row.get('phase')}): {holder}, "
                     f"{row.get('processes_alive')}/{row.get('processes')} processes alive, "
                     f"{len(row.get('hosts', []))} host(s), "
                     f"{len(row.get('tunnels', []))} tunnel end(s), "
                     f"{row.get('link_mode')}/{row.get('datapath')}")
        for prefix, ms in sorted(runs.items()):
            emit(f"run {prefix}: on {', '.join(ms)}")
    bad = [r for r in results if not r.ok]
    if bad:
        raise RuntimeFailure(f"machine {bad[0].machine} ({bad[0].address}): "
                             f"{bad[0].problem}")
    return 0
