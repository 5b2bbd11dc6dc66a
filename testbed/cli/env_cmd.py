"""`lightpipe env`: what this machine supports (root, netem, OVS, Prometheus, torch)."""

from __future__ import annotations

import argparse

from testbed.cli.common import emit, emit_json

HELP = "show what this machine supports for emulation"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    from testbed.envprobe import probe

    report = probe()
    if args.json:
        emit_json(report.as_dict())
        return 0
    rows = [
        ("root", report.root),
        ("netem qdisc", report.netem),
        ("link emulation", "netem" if report.netem else "userspace forwarder"),
        ("Open vSwitch", report.ovs_installed),
        ("OVS datapath", ("kernel" + (" (openvswitch module loadable: loaded on use)"
                                      if report.ovs_module == "loadable" else ""))
         if report.ovs_kernel_datapath else "userspace (netdev)"),
        ("mnexec", report.mnexec),
        ("mininet (python)", report.mininet_python),
        ("os-ken", report.os_ken),
        ("iperf3", report.iperf3),
        ("prometheus", report.prometheus or "missing"),
        ("torch", report.torch or "missing"),
        ("emulation possible", report.emulation_possible),
    ]
    for name, value in rows:
        if isinstance(value, bool):
            value = "yes" if value else "no"
        emit(f"{name:<20} {value}")
    for reason in report.reasons:
        emit(f"  - {reason}")
    return 0
