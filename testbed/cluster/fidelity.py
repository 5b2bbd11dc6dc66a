"""One fidelity verdict for a run across machines, from every machine's own measurements.

Each machine's agent reads what a one-machine run reads of itself (testbed.cluster.agent
`fidelity`): the CPU its forwarders, software switch and workers got (by the PIDs its run
state recorded), its hypervisor's steal, and its share holder's counters (forwarders'
drops and timer slack, its hosts' TCP counters, the shaped fabric's and the switch's
drops, the switch sockets' sizing). Here they become the inputs of the one-machine
verdict (testbed.emu.fidelity.verdict), with the DC pairs' RTTs the driver measured
across the machines:

* processes: every machine's, each tagged with its machine; a share judged over all;
* counters: summed (forwarders' totals, fabric and switch drops); TCP per host (a host
  lives on one machine);
* steal and socket sizing: the worst machine's, named;
* the clocks: each machine's offset error against the shortest iteration of a job;
* a machine whose measurements did not come back makes the run not faithful, with its
  reason: a verdict is never made from part of the cluster.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from testbed.emu.fidelity import Invariant, verdict
from testbed.emu.fidelity_probe import name_forwarders
from testbed.emu.scale import Scale

MAX_PROCESSES = 4096  # per machine: a reply past it is cut (the verdict reads shares)
MAX_CLOCK_SHARE = 0.01  # clock offset error / shortest iteration (of the 5 % agreement)


def _dict(x: Any) -> dict[str, Any]:
    return dict(x) if isinstance(x, Mapping) else {}


def _int(x: Any) -> int:
    return int(x) if isinstance(x, int | float) and not isinstance(x, bool) \
        and math.isfinite(x) else 0


def _ratio(sizing: Mapping[str, Any]) -> float:
    """How much of what was wanted a socket sizing got (an error: nothing)."""
    want, have = sizing.get("wanted_bytes"), sizing.get("bytes")
    if sizing.get("error") or not isinstance(have, int | float) or not want:
        return 0.0 if sizing.get("error") else math.inf
    return float(have) / float(want)


def merge(replies: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The verdict's inputs from every machine's `fidelity` reply (see the module
    docstring): processes, forwarder_stats, tcp, host, fabric, switch, send_socket,
    receive_sockets; and `machines` (per machine: ok, why, steal, processes read)."""
    procs: list[dict[str, Any]] = []
    fwd: list[dict[str, Any]] = []
    tcp: dict[str, dict[str, int]] = {}
    fabric = {"frames": 0, "segments_per_frame": 0}
    switch = {"frames": 0, "sockets": 0, "segments_per_frame": 0}
    machines: dict[str, dict[str, Any]] = {}
    host: dict[str, Any] | None = None
    send: dict[str, Any] | None = None
    recv: dict[str, Any] | None = None
    for m, r in sorted(replies.items()):
        r = _dict(r)
        net = _dict(r.get("network"))
        mine = [dict(p, machine=m) for p in (r.get("processes") or [])[:MAX_PROCESSES]
                if isinstance(p, Mapping) and isinstance(p.get("role"), str)]
        procs += mine
        fwd += [dict(st) for st in net.get("forwarders") or []
                if isinstance(st, Mapping) and "directions" in st]
        for h, counters in _dict(net.get("tcp")).items():
            tcp[str(h)] = {str(k): _int(v) for k, v in _dict(counters).items()}
        fab = _dict(net.get("fabric"))
        fabric["frames"] += _int(fab.get("frames"))
        fabric["segments_per_frame"] = max(fabric["segments_per_frame"],
                                           _int(fab.get("segments_per_frame")))
        sw = _dict(net.get("switch"))
        if sw:
            switch["frames"] += _int(sw.get("frames"))
            switch["sockets"] += _int(sw.get("sockets"))
            switch["segments_per_frame"] = max(switch["segments_per_frame"],
                                               _int(sw.get("segments_per_frame")))
        mh = _dict(r.get("host"))
        steal = mh.get("steal_frac")
        if isinstance(steal, int | float) and (host is None or steal > host["steal_frac"]):
            host = {**mh, "machine": m}
        for key in ("send_socket", "receive_sockets"):
            sizing = _dict(net.get(key))
            if not sizing:
                continue
            worst = send if key == "send_socket" else recv
            if worst is None or _ratio(sizing) < _ratio(worst):
                if key == "send_socket":
                    send = {**sizing, "machine": m}
                else:
                    recv = {**sizing, "machine": m}
        machines[m] = {"ok": bool(r.get("ok")), "why": r.get("why") if not r.get("ok")
                       else None, "steal_frac": steal, "processes": len(mine),
                       "forwarders": sum(1 for p in mine if p["role"] == "forwarder"),
                       "workers": sum(1 for p in mine if p["role"] == "worker")}
    return {"processes": procs, "forwarder_stats": fwd, "tcp": tcp, "host": host,
            "fabric": fabric if fabric["segments_per_frame"] else {},
            "switch": switch if switch["sockets"] else {},
            "send_socket": send, "receive_sockets": recv, "machines": machines}


def clock_invariant(scale: Scale, clocks: Mapping[str, Mapping[str, Any]],
                    jobs: Sequence[Mapping[str, Any]]) -> Invariant:
    """The machines' clocks against the jobs' iterations: a job's iteration time spans
    stages on several machines, each machine's records shifted by its measured offset,
    whose error is at most half the shortest of its round trips (testbed.cluster.clock);
    that error must stay a small part (MAX_CLOCK_SHARE) of the shortest iteration, in
    scenario time, so that the agreement's 5 % is the emulation's, not the clocks'."""
    why = ("the machines' clocks are known well enough for a job's iteration time across "
           "them")
    errs = [(float(c["error_ms"]), m) for m, c in clocks.items()
            if isinstance(c, Mapping) and isinstance(c.get("error_ms"), int | float)]
    its = [(float(j["emulated_iteration_time_s"]), str(j.get("job", "")))
           for j in jobs if isinstance(j.get("emulated_iteration_time_s"), int | float)
           and j["emulated_iteration_time_s"] > 0]
    if not errs or not its:
        return Invariant("clock_offset_error", None, MAX_CLOCK_SHARE, "max", "share",
                         "no job's iteration across machines" if errs else "", why)
    err_ms, m = max(errs)
    it_s, job = min(its)
    value = scale.real_ms(err_ms) / (it_s * 1e3)
    return Invariant("clock_offset_error", value, MAX_CLOCK_SHARE, "max", "share",
                     f"machine {m}: +-{scale.real_ms(err_ms):.4f} ms of {job}'s "
                     f"{it_s * 1e3:.2f} ms iteration", why)


def cluster_verdict(scale: Scale, plan: Any, rtt_rows: Sequence[Mapping[str, Any]],
                    replies: Mapping[str, Mapping[str, Any]],
                    jobs: Sequence[Mapping[str, Any]] = (),
                    clocks: Mapping[str, Mapping[str, Any]] | None = None,
                    faults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """summary.json `fidelity` of a run across machines: the one-machine verdict of every
    machine's measurements merged, the clocks' invariant added, with `machines`; not
    faithful where a machine's measurements are missing. `faults`: the network faults'
    accounting (testbed.emu.fidelity.fault_accounting), as on one machine."""
    got = merge(replies)
    v = verdict(scale, rtt_rows, name_forwarders(got["processes"], plan),
                got["forwarder_stats"], got["tcp"], jobs, got["host"], got["fabric"],
                got["switch"], got["send_socket"], got["receive_sockets"], faults)
    clock = clock_invariant(scale, clocks or {}, jobs)
    v["invariants"].append(clock.as_record())
    if not clock.ok:
        v["faithful"] = False
        v["reasons"].append(clock.reason())
    v["machines"] = got["machines"]
    lost = [f"machine {m}: fidelity not measured ({r.get('why') or 'no answer'})"
            for m, r in sorted(got["machines"].items()) if not r["ok"]]
    if lost:
        v["faithful"] = False
        v["reasons"] = [*v["reasons"], *lost]
    return v
