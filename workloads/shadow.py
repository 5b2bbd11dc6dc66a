"""Shadow stage: stands in for a large-model stage with calibrated tensor work (or a
stand-in accelerator's timer) and transfers of the job's (scaled) activation size,
following any schedule."""

from __future__ import annotations

from typing import Any

import torch

from testbed.schedule.model import Action
from workloads.compute import Burner, DeviceStandIn
from workloads.plan import JobPlan


class ShadowProgram:
    """Op time = the plan's stage time (emulation ms); payload = the plan's hop bytes."""

    def __init__(self, plan: JobPlan, rank: int, burner: Burner | DeviceStandIn) -> None:
        self.plan = plan
        self.rank = rank
        self.p = plan.stages
        sched = plan.sched()
        self.v = sched.virtual_stages
        self.burner = burner
        wf = plan.weight_grad_fraction
        f_s = plan.forward_ms[rank] / self.v / 1e3
        b_s = plan.backward_ms[rank] / self.v / 1e3
        self.dur_s = {"F": f_s, "B": b_s, "I": b_s * (1.0 - wf), "W": b_s * wf}
        self._payload: dict[int, torch.Tensor] = {}
        self._mark = (burner.asked_s, burner.chunks_run)

    def hop_bytes(self, lower_vstage: int) -> int:
        """Bytes crossing from virtual stage k to k+1 (and the gradient back)."""
        acts = self.plan.activation_bytes
        d = lower_vstage % self.p
        return acts[d] if d < self.p - 1 else max(acts)

    def _payload_for(self, lower_vstage: int) -> torch.Tensor:
        n = self.hop_bytes(lower_vstage)
        if n not in self._payload:
            self._payload[n] = torch.ones(n, dtype=torch.uint8)
        return self._payload[n]

    def recv_buffer(self, direction: str, virtual_stage: int) -> torch.Tensor:
        lower = virtual_stage - 1 if direction == "act" else virtual_stage
        return torch.empty(self.hop_bytes(lower), dtype=torch.uint8)

    def _work(self, kind: str) -> float:
        self.burner.burn(self.dur_s[kind])
        return self.dur_s[kind]

    def forward(self, it: int, action: Action, virtual_stage: int,
                inp: torch.Tensor | None) -> tuple[torch.Tensor | None, float]:
        comp = self._work("F")
        return self._payload_for(virtual_stage), comp

    def backward(self, it: int, action: Action, virtual_stage: int,
                 grad: torch.Tensor | None) -> tuple[torch.Tensor | None, float]:
        comp = self._work(action.kind)
        return self._payload_for(virtual_stage - 1), comp

    def weight(self, it: int, action: Action, virtual_stage: int) -> float:
        return self._work("W")

    def end_iteration(self, it: int) -> dict[str, Any]:
        """The CPU share (Burner.cpu_share) since the last iteration that had one: CPU
        starvation shows in it. An iteration with too little work to say (a small duty,
        short ops) has none, and its work counts in the next one's."""
        asked, chunks = self.burner.asked_s, self.burner.chunks_run
        share = self.burner.cpu_share(asked - self._mark[0], chunks - self._mark[1])
        if share is None:
            return {}
        self._mark = (asked, chunks)
        return {"cpu_share": round(share, 4)}
