"""`lightpipe emu SPEC --out DIR [--hold]`: run a scenario on the Mininet/OVS emulation."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from testbed.cli.common import add_run_args, emit

if TYPE_CHECKING:
    from testbed.spec import Scenario

HELP = "emulate a scenario (root): build, verify, probe, tear down; --hold keeps it up"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_run_args(parser)
    parser.add_argument("--hold", action="store_true",
                        help="keep the network up until Ctrl-C/SIGTERM (writes DIR/network.json)")
    parser.add_argument("--link-mode", default=None, choices=["auto", "netem", "userspace"],
                        help="override emulation.link_mode of the spec")
    parser.add_argument("--probe-seconds", type=float, default=4.0,
                        help="iperf3 seconds per lightpath (default 4)")
    cl = parser.add_argument_group("across machines (docs/cluster.md)")
    cl.add_argument("--cluster", metavar="FILE", default=None,
                    help="run across the machines of a cluster file: each machine's share "
                    "over SSH, workers on every machine, one Prometheus here (pp_jobs)")
    cl.add_argument("--place", action="append", default=[], metavar="DC=MACHINE",
                    help="with --cluster: put a DC (with its ROADM) on a machine")
    cl.add_argument("--datapath", choices=("auto", "user", "kernel"), default="auto",
                    help="with --cluster: Open vSwitch datapath on every machine")
    cl.add_argument("--ready-timeout", type=float, default=600.0, metavar="S",
                    help="with --cluster: how long a machine may take to bring its share "
                    "up (s)")
    cl.add_argument("--no-calibrate", dest="calibrate", action="store_false",
                    help="with --cluster: leave the fibres' delays as planned")


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from testbed.backends.emu import EmuBackend
    from testbed.errors import InputError, RuntimeFailure
    from testbed.spec import load_scenario

    scenario = load_scenario(args.spec)
    if args.cluster is not None:
        return run_cluster(args, scenario)
    for opt, given in (("--place", args.place), ("--datapath", args.datapath != "auto"),
                       ("--no-calibrate", not args.calibrate)):
        if given:
            raise InputError(opt, "only with --cluster")
    if not 0.5 <= args.probe_seconds <= 600:
        raise InputError("--probe-seconds", f"must be in [0.5, 600], got {args.probe_seconds}")
    from testbed.emu.plan import build_plan

    build_plan(scenario)  # bad input (too fast a link, unknown node) fails first, exit 2
    backend = EmuBackend()
    ok, reason = backend.available()
    if not ok:
        raise RuntimeFailure(f"emulation unavailable here: {reason}")
    from testbed.cli.common import check_out

    check_out(args.out, args.force)  # (SIGINT works even from a background shell: cli.main)
    out = Path(args.out)
    if args.hold:
        wl = scenario.workload
        count = getattr(wl, "requests", None) or getattr(wl, "jobs", "")
        unit = "requests" if wl.kind == "lightpath_requests" else "jobs"
        what = f"the {wl.kind} workload ({count} {unit})"
        emit(f"emu: --hold builds and verifies the network, then waits; it skips {what} and "
             "the iperf3 probes (run without --hold for those)")
    def on_hold(info: dict[str, object]) -> None:
        import sys

        emit(f"emu: network {info['prefix']} up and verified ({info['link_mode']} links); "
             f"{out}/network.json written")
        hosts = info["hosts"]
        assert isinstance(hosts, list)
        for h in hosts:
            emit(f"  {h['name']:<20} {h['dc']:<16} {h['ip']}")
        ctl = info.get("controller")
        if isinstance(ctl, dict):
            emit(f"emu: SDN controller REST API at {ctl['rest_url']} (bearer token in "
                 f"{out}/network.json)")
        prom = info.get("prometheus")  # issue 13
        if isinstance(prom, dict) and prom.get("url"):
            emit(f"emu: Prometheus at {prom['url']} (run {prom['run']})")
        emit("emu: holding; `lightpipe exec HOST -- CMD` runs in a host; Ctrl-C or SIGTERM "
             "tears down")
        sys.stdout.flush()

    summary = backend.run(scenario, out, quiet=args.quiet, hold=args.hold,
                          link_mode=args.link_mode, probe_seconds=args.probe_seconds,
                          on_hold=on_hold)
    from testbed.cli.summary import maybe_report, print_run, write_readme

    write_readme(out, f"LightPipe emu run of {scenario.name}")
    print_run("emu", out, args.out.rstrip("/"), summary, scenario,
              maybe_report(out, args.report and not args.hold))
    return 0


def run_cluster(args: argparse.Namespace, scenario: Scenario) -> int:
    """`emu SPEC --cluster FILE`: the cluster backend (testbed.backends.cluster), then the
    one-machine printout."""
    from pathlib import Path

    from testbed.backends.cluster import ClusterBackend
    from testbed.cli.cluster_cmd import up_options
    from testbed.cli.common import check_out
    from testbed.cli.summary import maybe_report, print_run, write_readme
    from testbed.emu.plan import build_plan
    from testbed.errors import InputError

    if args.hold:
        raise InputError("--hold", "not with --cluster (`lightpipe cluster up` holds a "
                         "network across machines)")
    build_plan(scenario)  # bad input first, exit 2
    check_out(args.out, args.force)
    out = Path(args.out)
    summary = ClusterBackend().run(scenario, out, args.quiet, options=up_options(args),
                                   echo=emit)
    write_readme(out, f"LightPipe emu run of {scenario.name} across machines")
    print_run("emu", out, args.out.rstrip("/"), summary, scenario,
              maybe_report(out, args.report))
    return 0
