"""Pure helpers over a scenario's events: link flaps as cuts and repairs, and kinds by layer.

The simulators see only the optical network: `network_events` turns every `link_flap`
into the `fiber_cut`/`fiber_repair` pairs it stands for (down at at_s + k x period_s,
up half a period later) and leaves out the faults of the testbed itself
(`prometheus_kill`, `controller_kill`, `worker_kill`), which `sim_fault_rows` records as
not applicable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from testbed.spec.models import EventSpec

NETWORK_KINDS = ("fiber_cut", "fiber_repair", "wavelength_loss", "wavelength_repair")
TESTBED_KINDS = ("prometheus_kill", "controller_kill", "worker_kill")  # not in the sim


def flap_steps(ev: EventSpec) -> list[tuple[float, bool]]:
    """(at_s, up) of every step of a link_flap: down at at_s + k x period_s, up half a
    period later, count times."""
    assert ev.period_s is not None and ev.count is not None
    half = ev.period_s / 2
    out: list[tuple[float, bool]] = []
    for k in range(ev.count):
        t = ev.at_s + k * ev.period_s
        out += [(t, False), (t + half, True)]
    return out


def expand_flap(ev: EventSpec) -> list[EventSpec]:
    """A link_flap as the fiber_cut/fiber_repair events it stands for."""
    return [EventSpec(at_s=t, kind="fiber_repair" if up else "fiber_cut", link=ev.link)
            for t, up in flap_steps(ev)]


def network_events(events: Sequence[EventSpec]) -> list[EventSpec]:
    """The events the optical network sees, flaps expanded, in time order (stable)."""
    return [ev for _, ev in indexed_network_events(events)]


def indexed_network_events(events: Sequence[EventSpec]) -> list[tuple[int, EventSpec]]:
    """network_events, each with the index of the spec event it comes from (a flap's
    cuts and repairs share their flap's index)."""
    out: list[tuple[int, EventSpec]] = []
    for i, ev in enumerate(events):
        if ev.kind == "link_flap":
            out += [(i, e) for e in expand_flap(ev)]
        elif ev.kind in NETWORK_KINDS:
            out.append((i, ev))
    return sorted(out, key=lambda p: p[1].at_s)


def sim_fault_rows(events: Sequence[EventSpec]) -> list[dict[str, Any]]:
    """summary.json `faults` of a simulation: one row per spec event, with what the
    simulator made of it."""
    rows = []
    for ev in sorted(events, key=lambda e: e.at_s):
        row: dict[str, Any] = {"kind": ev.kind, "target": ev.target, "at_s": ev.at_s}
        if ev.kind in TESTBED_KINDS:
            row["simulated"] = False
            row["note"] = "not applicable in the simulator (no " + {
                "prometheus_kill": "Prometheus", "controller_kill": "SDN controller process",
                "worker_kill": "worker processes"}[ev.kind] + ")"
        elif ev.kind == "link_flap":
            row["simulated"] = True
            row["note"] = f"simulated as {ev.count} fiber_cut + {ev.count} fiber_repair"
        else:
            row["simulated"] = True
        rows.append(row)
    return rows
