"""Delay calibration across machines: the one-machine calibration (testbed.emu.calibrate)
run by the driver of `lightpipe cluster up`, with every fibre's emulator on its machine.

Each round, every machine pings the DC pairs whose first DC it holds (sparse echoes and a
dense stream, kernel receive stamps on the sending machine: no shared clock is needed),
the driver solves the corrections exactly as on one machine (each lightpath on its own
where the emulators can, else one value per fibre, from the pairs that cross it; the
tunnel between the machines is part of the measured path, so its latency is taken off
like any other processing), and each machine's share holder applies its fibres' values
(`hold correct`, testbed.cluster.holdctl). The record has the one-machine shape.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from testbed.cluster.sharedoc import PairProbe
from testbed.emu.calibrate import CalibrationConfig, calibrate
from testbed.emu.delaycal import PathRtt
from testbed.emu.plan import EmuPlan, FibrePlan
from testbed.errors import RuntimeFailure

log = logging.getLogger(__name__)

# (machine, request) -> that machine's fibre states ({middle: state}); raises on failure
Apply = Callable[[str, dict[str, Any]], dict[str, Any]]
# probes -> the machines' rtt rows
Ping = Callable[[Sequence[PairProbe]], list[dict[str, Any]]]


class RemoteFibre:
    """What calibrate() needs of a LinkEmulator, for one on another machine: it keeps the
    values set since the last flush and mirrors what the machine reported."""

    def __init__(self, fibre: FibrePlan, machine: str, state: Mapping[str, Any]) -> None:
        self.fibre = fibre
        self.machine = machine
        self.correction_ms: float | None = None
        self.vlan_corrections_ms: dict[int, float] = {}
        self.per_vlan = False
        self._emulated_ms = fibre.delay_ms
        self.pending_fibre: float | None = None
        self.pending_vlans: dict[int, float] = {}
        self.mirror(state)

    def mirror(self, state: Mapping[str, Any]) -> None:
        """Take the machine's report as the truth."""
        self._emulated_ms = float(state["emulated_ms"])
        c = state.get("correction_ms")
        self.correction_ms = None if c is None else float(c)
        self.vlan_corrections_ms = {int(v): float(x)
                                    for v, x in dict(state.get("vlans", {})).items()}
        self.per_vlan = bool(state.get("per_vlan"))

    def emulated_delay_ms(self, vlan: int | None = None) -> float:
        extra = self.vlan_corrections_ms.get(vlan, 0.0) if vlan is not None else 0.0
        return max(0.0, self._emulated_ms - extra)

    def set_delay_correction(self, correction_ms: float) -> None:
        c = max(0.0, correction_ms)
        self.correction_ms = c
        self._emulated_ms = max(0.0, self.fibre.delay_ms - c)
        self.pending_fibre = c

    def set_vlan_correction(self, vlan: int, correction_ms: float) -> bool:
        if not self.per_vlan:
            return False
        self.vlan_corrections_ms[vlan] = correction_ms
        self.pending_vlans[vlan] = correction_ms
        return True

    @property
    def pending(self) -> bool:
        return self.pending_fibre is not None or bool(self.pending_vlans)


def flush(fibres: Mapping[str, RemoteFibre], apply: Apply) -> int:
    """Send every machine the values set since the last flush (one request per machine);
    mirror what each reports. The number of machines asked."""
    by: dict[str, dict[str, Any]] = {}
    for node, f in fibres.items():
        if not f.pending:
            continue
        req = by.setdefault(f.machine, {"fibres": {}, "vlans": {}})
        if f.pending_fibre is not None:
            req["fibres"][node] = f.pending_fibre
        if f.pending_vlans:
            req["vlans"][node] = dict(f.pending_vlans)
    for machine, req in by.items():
        states = apply(machine, req)
        for node, f in fibres.items():
            if f.machine == machine:
                if node not in states:
                    raise RuntimeFailure(f"machine {machine} did not report fibre {node}")
                f.mirror(states[node])
                f.pending_fibre, f.pending_vlans = None, {}
    return len(by)


def calibration_probes(probes: Sequence[PairProbe], cfg: CalibrationConfig
                       ) -> list[PairProbe]:
    """The check's probes with the calibration's echo counts (a dense stream as on one
    machine: each machine pings its pairs one at a time)."""
    return [dataclasses.replace(p, pings=cfg.pings, interval_s=cfg.interval_s,
                                dense_pings=cfg.dense_pings,
                                dense_interval_s=cfg.dense_interval_s) for p in probes]


def path_rtts(rows: Sequence[Mapping[str, Any]], probes: Sequence[PairProbe],
              middle_of: Mapping[str, str]) -> list[PathRtt]:
    """The machines' rtt rows as PathRtt, fibres named by their emulators (middle nodes),
    in the probes' order; a pair without a row or a reply is left out."""
    got = {str(r.get("pair")): r for r in rows}
    out = []
    for p in probes:
        r = got.get(p.pair)
        if r is None or not r.get("rtts_ms"):
            continue
        out.append(PathRtt(p.pair, tuple(middle_of[f] for f in p.fibres), p.configured_ms,
                           tuple(float(x) for x in r["rtts_ms"]), p.vlan,
                           dense_rtts_ms=tuple(float(x) for x in r.get("dense_rtts_ms", ()))))
    return out


def fibre_labels(plan: EmuPlan) -> dict[str, str]:
    """A probe's fibre label ("u-v", both ways) -> the fibre's emulator (middle node)."""
    out: dict[str, str] = {}
    for f in plan.fibres:
        out[f"{f.u}-{f.v}"] = f.middle
        out[f"{f.v}-{f.u}"] = f.middle
    return out


def calibrate_cluster(plan: EmuPlan, fibre_machine: Mapping[str, str],
                      probes: Sequence[PairProbe], apply: Apply, ping: Ping,
                      cfg: CalibrationConfig) -> dict[str, Any]:
    """Calibrate every fibre of a run held across machines; the one-machine record with
    each fibre's machine. fibre_machine: middle node -> the machine emulating it."""
    by_middle = {f.middle: f for f in plan.fibres}
    # Each machine's emulators as they run now (netem's start-up guess included).
    states: dict[str, Any] = {}
    for machine in sorted(set(fibre_machine.values())):
        states |= apply(machine, {"fibres": {}, "vlans": {}})
    missing = sorted(set(fibre_machine) - set(states))
    if missing:
        raise RuntimeFailure(f"fibre(s) not reported by their machine: {', '.join(missing)}")
    remote = {m: RemoteFibre(by_middle[m], fibre_machine[m], states[m])
              for m in sorted(fibre_machine)}
    labels = fibre_labels(plan)
    asked = calibration_probes(probes, cfg)

    def measure() -> list[PathRtt]:
        flush(remote, apply)
        return path_rtts(ping(asked), asked, labels)

    record = calibrate(remote, measure, cfg)  # type: ignore[arg-type]
    flush(remote, apply)  # the kept round's settings (calibrate may restore an earlier one)
    for row in record["fibres"]:
        row["machine"] = fibre_machine[row["middle"]]
    return record
