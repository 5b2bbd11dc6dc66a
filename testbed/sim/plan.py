"""Static plan: every request of the workload at once (no departures), with its lightpath."""

from __future__ import annotations

import random
from typing import Any

from testbed.jobs.sim import plan_jobs
from testbed.optical.network import Lightpath, OpticalNetwork
from testbed.sim.engine import request_stream
from testbed.spec.models import LightpathRequestsWorkload, Scenario


def lightpath_record(lp: Lightpath) -> dict[str, Any]:
    """JSON view of a lightpath (route, fibres, block, modulation, capacity)."""
    return {"lightpath_id": lp.id, "src": lp.src, "dst": lp.dst, "route": list(lp.nodes),
            "fibres": [list(f) for f in lp.fibres], "first_slot": lp.first_slot,
            "slots": lp.n_slots, "modulation": lp.modulation,
            "capacity_gbps": lp.capacity_gbps, "length_km": lp.length_km,
            "latency_ms": round(lp.latency_ms, 6)}


def plan_lightpaths(scenario: Scenario) -> dict[str, Any]:
    """Route every request in arrival order on an empty network; nothing departs."""
    wl = scenario.workload
    assert isinstance(wl, LightpathRequestsWorkload)
    net = OpticalNetwork.from_scenario(scenario)
    stream, _ = request_stream(scenario, net)
    policy = scenario.policy.spectrum
    rng = random.Random(f"{wl.seed}:spectrum")
    lightpaths: list[dict[str, Any]] = []
    blocked: list[dict[str, Any]] = []
    bitrate_req = bitrate_blocked = 0.0
    for rid, _, _, src, dst, br in stream:
        bitrate_req += br
        got = net.allocate_or_reason(src, dst, bitrate_gbps=br, policy=policy, rng=rng)
        if isinstance(got, Lightpath):
            lightpaths.append({"request_id": rid, "bitrate_gbps": br} | lightpath_record(got))
        else:
            bitrate_blocked += br
            blocked.append({"request_id": rid, "src": src, "dst": dst, "bitrate_gbps": br,
                            "reason": got})
    n = len(lightpaths) + len(blocked)
    return {
        "scenario": scenario.name,
        "workload": "lightpath_requests",
        "view": "static: all requests at once, no departures",
        "topology": net.topology.name,
        "policy": policy,
        "slots": net.slots,
        "requests": n,
        "accepted": len(lightpaths),
        "blocked": len(blocked),
        "blocking_ratio": len(blocked) / n if n else 0.0,
        "bitrate_blocking_ratio": bitrate_blocked / bitrate_req if bitrate_req else 0.0,
        "spectrum_utilization": round(net.utilization(), 9),
        "lightpaths": lightpaths,
        "blocked_requests": blocked,
    }


def plan(scenario: Scenario) -> dict[str, Any]:
    """The static plan of a scenario (lightpath requests here; PP jobs via testbed.jobs)."""
    if scenario.workload.kind == "lightpath_requests":
        return plan_lightpaths(scenario)
    result: dict[str, Any] = plan_jobs(scenario)
    return result
