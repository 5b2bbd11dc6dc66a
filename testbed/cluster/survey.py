"""What `cluster check`, `cluster status`, `cluster down` and `clean --cluster` report."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from testbed.cluster.bringup import check_prefix, report_down
from testbed.cluster.checks import Echo, log_line
from testbed.cluster.cleanup import MachineClean, clean_cluster
from testbed.cluster.drive import ShareResult, down_shares, status_shares
from testbed.cluster.place import parse_overrides, place
from testbed.cluster.remote import MachineCheck, check_cluster
from testbed.cluster.spec import ClusterSpec
from testbed.cluster.tunnel import plan_tunnels
from testbed.emu.plan import build_plan
from testbed.errors import InputError, RuntimeFailure
from testbed.spec import Scenario


def first_failure(bad: Sequence[tuple[str, str, str]], more: bool = True
                  ) -> RuntimeFailure | None:
    """The error naming the first (machine, address, problem) of `bad`, with how many more
    are listed above it when `more`; None when nothing is bad."""
    if not bad:
        return None
    machine, address, problem = bad[0]
    tail = (f" (and {len(bad) - 1} more machine(s), listed above)"
            if more and len(bad) > 1 else "")
    return RuntimeFailure(f"machine {machine} ({address}): {problem}{tail}")


def placement_doc(cluster: ClusterSpec, scenario: Scenario, overrides_given: Sequence[str],
                  prefix: str | None) -> dict[str, Any]:
    """Where each DC would run, the load per machine, the crossing fibres and their
    tunnels."""
    check_prefix(prefix)
    plan = build_plan(scenario, prefix)
    overrides = parse_overrides(list(overrides_given), [d.name for d in scenario.dcs],
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


def check_doc(cluster: ClusterSpec, scenario: Scenario | None, overrides: Sequence[str],
              prefix: str | None, offline: bool
              ) -> tuple[dict[str, Any], list[MachineCheck]]:
    """`cluster check`'s document (placement and tunnels with a scenario; every machine
    checked over SSH unless offline) and the machines' checks."""
    doc: dict[str, Any] = {"cluster": cluster.name, "machines": list(cluster.machine_names)}
    if scenario is not None:
        doc.update(placement_doc(cluster, scenario, overrides, prefix))
    elif overrides:
        raise InputError("--place", "needs a SPEC to place")
    checks = [] if offline else check_cluster(cluster)
    if not offline:
        doc["checks"] = [{"machine": c.machine, "address": c.address, "ok": c.ok,
                          "problems": c.problems, "tools": c.tools, "root": c.root,
                          "underlay_dev": c.underlay_dev, "underlay_mtu": c.underlay_mtu,
                          "kernel": c.kernel} for c in checks]
    return doc, checks


def check_lines(doc: dict[str, Any], checks: Sequence[MachineCheck]) -> list[str]:
    """`cluster check`'s report, a line each: machines, placement, tunnels, checks."""
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


def check_failure(checks: Sequence[MachineCheck]) -> RuntimeFailure | None:
    """The first machine that is not fit, with its problems."""
    return first_failure([(c.machine, c.address, "; ".join(c.problems))
                          for c in checks if not c.ok])


def clean(cluster: ClusterSpec, prefixes: Sequence[str], dry_run: bool, force: bool,
          echo: Echo = log_line) -> RuntimeFailure | None:
    """`clean --cluster`: every machine cleaned; its lines prefixed by its name, then one
    line per machine; the first machine not cleaned (the others were), or None."""
    results: list[MachineClean] = clean_cluster(cluster, prefixes, dry_run, force)
    for r in results:
        for line in r.lines:
            echo(f"{r.machine}: {line}")
    for r in results:
        echo(f"clean {r.line(dry_run)}")
    return first_failure([(r.machine, r.address, r.problem) for r in results if not r.ok])


def take_down(cluster: ClusterSpec, prefix: str, echo: Echo = log_line
              ) -> RuntimeFailure | None:
    """`cluster down`: the run's shares stopped and cleaned on every machine; the first
    machine where that failed, or None (the prefix is checked: check_prefix)."""
    results = down_shares(cluster, prefix)
    report_down(results, echo)
    return first_failure([(r.machine, r.address, r.problem) for r in results if not r.ok])


def status(cluster: ClusterSpec) -> tuple[dict[str, Any], list[ShareResult]]:
    """`cluster status`'s record: per machine the shares it holds (as its own state
    records them), and each run with the machines that hold part of it."""
    results = status_shares(cluster)
    doc: dict[str, Any] = {"cluster": cluster.name, "machines": {}}
    runs: dict[str, list[str]] = {}
    for r in results:
        doc["machines"][r.machine] = ({"address": r.address, "shares": r.rows} if r.ok else
                                      {"address": r.address, "error": r.problem})
        for row in r.rows if r.ok else []:
            runs.setdefault(str(row.get("prefix")), []).append(r.machine)
    doc["runs"] = runs
    return doc, results


def status_lines(doc: dict[str, Any], results: Sequence[ShareResult]) -> list[str]:
    """`cluster status`'s report, a line per share and per run."""
    out = []
    for r in results:
        if not r.ok:
            out.append(f"{r.head()}: {r.problem}")
            continue
        if not r.rows:
            out.append(f"{r.head()}: holds no share")
        for row in r.rows:
            if "error" in row:
                out.append(f"{r.head()}: run {row['prefix']}: {row['error']}")
                continue
            holder = ("holder alive" if row.get("holder_alive") else
                      "holder GONE (lightpipe clean --cluster FILE)")
            out.append(f"{r.head()}: run {row['prefix']} ({row.get('phase')}): {holder}, "
                       f"{row.get('processes_alive')}/{row.get('processes')} processes "
                       f"alive, {len(row.get('hosts', []))} host(s), "
                       f"{len(row.get('tunnels', []))} tunnel end(s), "
                       f"{row.get('link_mode')}/{row.get('datapath')}")
    for prefix, ms in sorted(doc["runs"].items()):
        out.append(f"run {prefix}: on {', '.join(ms)}")
    return out


def status_failure(results: Sequence[ShareResult]) -> RuntimeFailure | None:
    """The first machine that could not be asked."""
    return first_failure([(r.machine, r.address, r.problem) for r in results if not r.ok],
                         more=False)
