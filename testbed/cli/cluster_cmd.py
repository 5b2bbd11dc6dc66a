"""`lightpipe cluster check --cluster FILE [SPEC]`: placement, crossing fibres, tunnels,
and whether every machine is reachable and has what LightPipe needs; and the report of
`lightpipe clean --cluster FILE` (run_clean)."""

from __future__ import annotations

import argparse
from typing import Any

HELP = "emulation across machines: check a cluster file (placement, tunnels, SSH, tools)"


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
    parser.set_defaults(cluster_action=None)


def run(args: argparse.Namespace) -> int:
    from testbed.cli.common import emit, emit_json
    from testbed.cluster.spec import load_cluster
    from testbed.errors import InputError, RuntimeFailure

    if args.cluster_action != "check":
        raise InputError("ACTION", "expected `check`")
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
