"""What one pipeline job's workers execute: schedule, emulated op times and transfer sizes.

A `JobPlan` is plain JSON-able data handed to every worker of a job. It is built from
the same `PipelineProblem` and `Schedule` objects that the simulator times, scaled to
emulation units:

* compute time of an op (ms) = real op time x `time_factor`;
* bytes sent per transfer = real activation bytes x `time_factor` / `bandwidth_divisor`
  (`testbed.emu.scale.Scale`, which also says why the two factors give one clock).

Pure code: no torch import.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from testbed.emu.scale import Scale
from testbed.errors import InputError
from testbed.schedule.model import PipelineProblem, Schedule

Mode = Literal["shadow", "model"]
MODES = ("shadow", "model")
Compute = Literal["cpu", "device"]
COMPUTES = ("cpu", "device")  # workloads.compute's (that module imports torch)


@dataclass(frozen=True)
class TinyGPTConfig:
    """A small GPT-style transformer for `model` mode (trained on synthetic tokens)."""

    vocab: int = 64
    hidden: int = 64
    layers: int = 4
    heads: int = 4
    seq_len: int = 32
    micro_batch: int = 4
    lr: float = 3e-3
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("vocab", "hidden", "layers", "heads", "seq_len", "micro_batch"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise InputError(f"model.{name}", f"must be an integer >= 1, got {value!r}")
        if self.hidden % self.heads:
            raise InputError("model.heads", f"hidden {self.hidden} is not a multiple of "
                             f"heads {self.heads}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise InputError("model.lr", f"must be > 0, got {self.lr}")

    @property
    def activation_bytes(self) -> int:
        """float32 activation of one micro-batch at a stage boundary."""
        return 4 * self.micro_batch * self.seq_len * self.hidden


@dataclass(frozen=True)
class JobPlan:
    """Everything the workers of one job need (emulation units: ms and bytes)."""

    job: str
    mode: Mode
    schedule: dict[str, Any]
    forward_ms: tuple[float, ...]
    backward_ms: tuple[float, ...]
    activation_bytes: tuple[int, ...]
    microbatches: int
    iterations: int
    warmup_iterations: int = 1
    weight_grad_fraction: float = 0.5
    time_factor: float = 1.0
    bandwidth_divisor: float = 1.0
    model: TinyGPTConfig | None = None
    info: dict[str, Any] = field(default_factory=dict)
    # shadow: where an op's time is spent (cpu: tensor work on the host; device: a stand-in
    # accelerator's timer, the host CPU left free; workloads.compute)
    compute: Compute = "cpu"

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InputError("mode", f"unknown worker mode {self.mode!r} (known: "
                             f"{', '.join(MODES)})")
        if self.compute not in COMPUTES:
            raise InputError("compute", f"unknown compute {self.compute!r} (known: "
                             f"{', '.join(COMPUTES)})")
        if self.mode == "model" and self.compute != "cpu":
            raise InputError("compute", "model mode computes its own model on the CPU; "
                             f"compute {self.compute!r} is for shadow workers")
        p = len(self.forward_ms)
        if p < 1 or len(self.backward_ms) != p:
            raise InputError("forward_ms", "forward_ms and backward_ms need one value per stage")
        if len(self.activation_bytes) != max(p - 1, 0) and not (p == 1 and
                                                                 not self.activation_bytes):
            raise InputError("activation_bytes", f"needs {p - 1} values (one per hop), got "
                             f"{len(self.activation_bytes)}")
        if self.iterations < 1 or self.warmup_iterations < 0:
            raise InputError("iterations", "iterations >= 1 and warmup_iterations >= 0 needed")
        self.scale  # noqa: B018  (raises InputError on a factor out of bounds)
        sched = self.sched()
        if sched.stages != p:
            raise InputError("schedule", f"schedule has {sched.stages} stage lists, plan has "
                             f"{p} stages")
        if self.mode == "model":
            if self.model is None:
                raise InputError("model", "model mode needs a model config")
            if sched.virtual_stages != 1 or sched.split_backward:
                raise InputError("schedule", f"model mode runs schedules of F/B actions with one "
                                 f"chunk per stage; {sched.name!r} is not one")
            if self.model.layers < p:
                raise InputError("model.layers", f"{self.model.layers} layers cannot fill {p} "
                                 "stages")

    @property
    def stages(self) -> int:
        return len(self.forward_ms)

    @property
    def scale(self) -> Scale:
        """The run's scale, which converts this plan's times back to real ones."""
        return Scale(self.bandwidth_divisor, self.time_factor)

    def sched(self) -> Schedule:
        return Schedule.from_dict(self.schedule)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobPlan:
        data = dict(data)
        model = data.pop("model", None)
        return cls(model=TinyGPTConfig(**model) if model else None,
                   forward_ms=tuple(data.pop("forward_ms")),
                   backward_ms=tuple(data.pop("backward_ms")),
                   activation_bytes=tuple(int(b) for b in data.pop("activation_bytes")),
                   **data)

    @classmethod
    def load(cls, path: Path) -> JobPlan:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise InputError(str(path), f"not a job plan: {exc}") from exc


def shadow_plan(job: str, problem: PipelineProblem, schedule: Schedule, *, iterations: int,
                bandwidth_divisor: float, time_factor: float, warmup_iterations: int = 1,
                info: dict[str, Any] | None = None, compute: Compute = "cpu") -> JobPlan:
    """scaled_plan with the scale given as its two factors."""
    return scaled_plan(job, problem, schedule, Scale(bandwidth_divisor, time_factor),
                       iterations=iterations, warmup_iterations=warmup_iterations, info=info,
                       compute=compute)


def scaled_plan(job: str, problem: PipelineProblem, schedule: Schedule, scale: Scale, *,
                iterations: int, warmup_iterations: int = 1,
                info: dict[str, Any] | None = None, compute: Compute = "cpu") -> JobPlan:
    """The plan that makes the workers execute `schedule` on `problem` in emulation units."""
    p = problem.stages
    acts = tuple(scale.transfer_bytes(problem.hop_activation_mb(h) * 1e6) for h in range(p - 1))
    return JobPlan(job=job, mode="shadow", schedule=schedule.to_dict(),
                   forward_ms=tuple(scale.delay_ms(f) for f in problem.forward_ms),
                   backward_ms=tuple(scale.delay_ms(b) for b in problem.backward_ms),
                   activation_bytes=acts, microbatches=problem.microbatches,
                   iterations=iterations, warmup_iterations=warmup_iterations,
                   weight_grad_fraction=problem.weight_grad_fraction,
                   time_factor=scale.time_factor,
                   bandwidth_divisor=scale.bandwidth_divisor, info=dict(info or {}),
                   compute=compute)


def model_plan(job: str, schedule: Schedule, microbatches: int, *, iterations: int,
               config: TinyGPTConfig | None = None, warmup_iterations: int = 1,
               info: dict[str, Any] | None = None) -> JobPlan:
    """A plan that trains the tiny GPT with `schedule` (compute time is the model's own)."""
    cfg = config or TinyGPTConfig()
    p = schedule.stages
    return JobPlan(job=job, mode="model", schedule=schedule.to_dict(),
                   forward_ms=(0.0,) * p, backward_ms=(0.0,) * p,
                   activation_bytes=(cfg.activation_bytes,) * (p - 1),
                   microbatches=microbatches, iterations=iterations,
                   warmup_iterations=warmup_iterations, model=cfg, info=dict(info or {}))
