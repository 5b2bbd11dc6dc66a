"""Data model of a pipeline schedule: the problem (stages, hops), actions and schedules.

A schedule is plain data: for every device (pipeline stage) an ordered list of
actions. The same object is timed by `testbed.schedule.timer` and executed by the
real PyTorch workers.

Action string forms (see docs/schedules.md):
  "F3"   forward of micro-batch 3          "B3"  full backward of micro-batch 3
  "I3"   input-gradient half of backward    "W3"  weight-gradient half of backward
  "F3@1" forward of micro-batch 3 on the device's local model chunk 1 (interleaved);
         chunk 0 is written without the suffix.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from testbed.errors import InputError

KINDS = ("F", "B", "I", "W")
_ACTION_RE = re.compile(r"^([FBIW])(\d+)(?:@(\d+))?$")


class ScheduleError(InputError):
    """A schedule is invalid for its problem (missing ops, deadlock, memory cap)."""

    def __init__(self, message: str, path: str = "schedule") -> None:
        super().__init__(path, message)


@dataclass(frozen=True, slots=True)
class Hop:
    """One stage boundary (stage s -> s+1): one-way latency and bandwidth per direction."""

    latency_ms: float = 0.0
    bandwidth_gbps: float = math.inf

    def __post_init__(self) -> None:
        if not (self.latency_ms >= 0 and math.isfinite(self.latency_ms)):
            raise InputError("latency_ms", f"must be a finite number >= 0, got {self.latency_ms}")
        if not self.bandwidth_gbps > 0:
            raise InputError("bandwidth_gbps", f"must be > 0, got {self.bandwidth_gbps}")

    def serialisation_ms(self, size_mb: float) -> float:
        """Time a transfer of size_mb (1 MB = 1e6 bytes) occupies the link: 8a/g ms."""
        if math.isinf(self.bandwidth_gbps):
            return 0.0
        return 8.0 * size_mb / self.bandwidth_gbps


def _floats(name: str, values: Sequence[float], n: int, minimum_exclusive: bool) -> tuple:
    out = tuple(float(v) for v in values)
    if len(out) != n:
        raise InputError(name, f"needs {n} values, got {len(out)}")
    for i, v in enumerate(out):
        if not math.isfinite(v) or v < 0 or (minimum_exclusive and v == 0):
            bound = "> 0" if minimum_exclusive else ">= 0"
            raise InputError(f"{name}[{i}]", f"must be a finite number {bound}, got {v}")
    return out


@dataclass(frozen=True)
class PipelineProblem:
    """A pipeline to schedule: p stages in a chain, m micro-batches.

    forward_ms/backward_ms: per stage compute time of one micro-batch.
    hops: p-1 boundaries; hop h joins stage h and h+1 (one FIFO link per direction).
    activation_mb: size of an activation (and of its gradient) crossing a hop, one
      value for all hops or one per hop.
    memory_cap: most micro-batches whose activations a stage may hold at once (one
      value or one per stage); None = unlimited.
    weight_grad_fraction: share of backward_ms spent on the weight gradient (W) when a
      schedule splits backward into I and W (zero-bubble); I takes the rest.
    """

    forward_ms: tuple[float, ...]
    backward_ms: tuple[float, ...]
    hops: tuple[Hop, ...]
    activation_mb: float | tuple[float, ...]
    microbatches: int
    memory_cap: int | tuple[int, ...] | None = None
    weight_grad_fraction: float = 0.5
    _caps: tuple[int | None, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        p = len(self.forward_ms)
        if p < 1:
            raise InputError("stages", "need at least 1 stage")
        set_ = object.__setattr__
        set_(self, "forward_ms", _floats("forward_ms", self.forward_ms, p, True))
        set_(self, "backward_ms", _floats("backward_ms", self.backward_ms, p, True))
        hops = tuple(self.hops)
        if len(hops) != p - 1:
            raise InputError("hops", f"{p} stages need {p - 1} hops, got {len(hops)}")
        for i, h in enumerate(hops):
            if not isinstance(h, Hop):
                raise InputError(f"hops[{i}]", f"must be a Hop, got {h!r}")
        set_(self, "hops", hops)
        if isinstance(self.activation_mb, int | float):
            act = float(self.activation_mb)
            if not (math.isfinite(act) and act >= 0):
                raise InputError("activation_mb", f"must be a finite number >= 0, got {act}")
            set_(self, "activation_mb", act)
        else:
            set_(self, "activation_mb", _floats("activation_mb", self.activation_mb, p - 1, False))
        if isinstance(self.microbatches, bool) or not isinstance(self.microbatches, int) \
                or self.microbatches < 1:
            raise InputError("microbatches", f"must be an integer >= 1, got {self.microbatches}")
        if not 0.0 <= float(self.weight_grad_fraction) < 1.0:
            raise InputError("weight_grad_fraction",
                             f"must be in [0, 1), got {self.weight_grad_fraction}")
        cap = self.memory_cap
        if cap is None:
            caps: tuple[int | None, ...] = (None,) * p
        elif isinstance(cap, int) and not isinstance(cap, bool):
            caps = (cap,) * p
        else:
            caps = tuple(cap)  # type: ignore[arg-type]
            if len(caps) != p:
                raise InputError("memory_cap", f"needs 1 or {p} values, got {len(caps)}")
            set_(self, "memory_cap", caps)
        for i, c in enumerate(caps):
            if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
                raise InputError(f"memory_cap[{i}]", f"must be an integer >= 1, got {c}")
        set_(self, "_caps", caps)

    # -- convenience -------------------------------------------------------------------
    @classmethod
    def uniform(cls, stages: int, microbatches: int, forward_ms: float, backward_ms: float,
                latency_ms: float = 0.0, bandwidth_gbps: float = math.inf,
                activation_mb: float = 0.0, memory_cap: int | None = None,
                weight_grad_fraction: float = 0.5) -> PipelineProblem:
        """All stages and hops alike."""
        if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
            raise InputError("stages", f"must be an integer >= 1, got {stages}")
        hop = Hop(latency_ms, bandwidth_gbps)
        return cls((forward_ms,) * stages, (backward_ms,) * stages, (hop,) * (stages - 1),
                   activation_mb, microbatches, memory_cap, weight_grad_fraction)

    @property
    def stages(self) -> int:
        return len(self.forward_ms)

    @property
    def caps(self) -> tuple[int | None, ...]:
        """Memory cap per stage (None = unlimited)."""
        return self._caps

    def hop_activation_mb(self, h: int) -> float:
        act = self.activation_mb
        return act if isinstance(act, float) else act[h]

    def max_activation_mb(self) -> float:
        act = self.activation_mb
        if isinstance(act, float):
            return act
        return max(act, default=0.0)

    def hop_serialisation_ms(self, h: int) -> float:
        return self.hops[h].serialisation_ms(self.hop_activation_mb(h))

    def input_grad_ms(self, s: int) -> float:
        return self.backward_ms[s] * (1.0 - self.weight_grad_fraction)

    def weight_grad_ms(self, s: int) -> float:
        return self.backward_ms[s] * self.weight_grad_fraction

    def with_memory_cap(self, cap: int | Sequence[int] | None) -> PipelineProblem:
        return PipelineProblem(self.forward_ms, self.backward_ms, self.hops, self.activation_mb,
                               self.microbatches, cap if cap is None or isinstance(cap, int)
                               else tuple(cap), self.weight_grad_fraction)

    def no_delay(self) -> PipelineProblem:
        """The same pipeline with ideal links (no latency, infinite bandwidth)."""
        return PipelineProblem(self.forward_ms, self.backward_ms,
                               tuple(Hop() for _ in self.hops), self.activation_mb,
                               self.microbatches, self.memory_cap, self.weight_grad_fraction)


@dataclass(frozen=True, slots=True, order=True)
class Action:
    """One operation of a device: kind F/B/I/W, micro-batch, local model chunk."""

    kind: str
    microbatch: int
    chunk: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ScheduleError(f"action kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.microbatch < 0 or self.chunk < 0:
            raise ScheduleError(f"negative micro-batch or chunk in action {self.kind}"
                                f"{self.microbatch}@{self.chunk}")

    def __str__(self) -> str:
        base = f"{self.kind}{self.microbatch}"
        return base if self.chunk == 0 else f"{base}@{self.chunk}"

    @classmethod
    def parse(cls, text: str) -> Action:
        m = _ACTION_RE.match(text.strip())
        if not m:
            raise ScheduleError(f"bad action {text!r} (expected e.g. F3, B3, I3, W3, F3@1)")
        return cls(m.group(1), int(m.group(2)), int(m.group(3) or 0))


@dataclass(frozen=True)
class Schedule:
    """Per-device ordered action lists; `virtual_stages` chunks per device (interleaved).

    Device d's chunk c is virtual stage c * p + d (Megatron's interleaved layout), so a
    micro-batch visits devices 0..p-1 once per chunk.
    """

    name: str
    actions: tuple[tuple[Action, ...], ...]
    virtual_stages: int = 1
    info: dict = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "actions", tuple(tuple(a) for a in self.actions))
        if self.virtual_stages < 1:
            raise ScheduleError(f"virtual_stages must be >= 1, got {self.virtual_stages}")

    @property
    def stages(self) -> int:
        return len(self.actions)

    @property
    def split_backward(self) -> bool:
        return any(a.kind in ("I", "W") for acts in self.actions for a in acts)

    def split(self, name: str | None = None) -> Schedule:
        """The same order with every B replaced by I then W at once: it is never slower
        (the gradient leaves at the end of I, before B would end) and holds no more
        memory (testbed.schedule.memory: W's buffers are smaller than the activations)."""
        rows = []
        for acts in self.actions:
            row: list[Action] = []
            for a in acts:
                if a.kind == "B":
                    row += [Action("I", a.microbatch, a.chunk), Action("W", a.microbatch, a.chunk)]
                else:
                    row.append(a)
            rows.append(tuple(row))
        return Schedule(name or self.name, tuple(rows), self.virtual_stages, dict(self.info))

    def as_strings(self) -> list[list[str]]:
        return [[str(a) for a in acts] for acts in self.actions]

    def to_dict(self) -> dict:
        return {"name": self.name, "virtual_stages": self.virtual_stages,
                "actions": self.as_strings()}

    @classmethod
    def from_strings(cls, name: str, actions: Iterable[Iterable[str] | str],
                     virtual_stages: int = 1) -> Schedule:
        """Build from per-device lists of action strings (or space-separated strings)."""
        rows = []
        for row in actions:
            items = row.split() if isinstance(row, str) else list(row)
            rows.append(tuple(Action.parse(x) for x in items))
        return cls(name, tuple(rows), virtual_stages)

    @classmethod
    def from_dict(cls, data: dict) -> Schedule:
        return cls.from_strings(str(data["name"]), data["actions"],
                                int(data.get("virtual_stages", 1)))

    def __str__(self) -> str:
        return "\n".join(f"{s}: {' '.join(row)}" for s, row in enumerate(self.as_strings()))
