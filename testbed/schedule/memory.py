"""Per-stage peak HBM bytes of a schedule: weights + optimizer state + held activations.

Model (docs/schedules.md, "Memory in bytes"), per GPU of a stage that is split over
`tensor_parallel` GPUs with sequence parallelism (every term below divided by t):

* Static bytes = parameters of the stage x `bytes_per_param` (16 for mixed-precision
  Adam: 2 bf16 weights + 4 fp32 master weights + 8 fp32 Adam moments + 2 bf16 grads).
  A layer has ``4 h^2 + k h f`` weights (k = 3 for a gated/SwiGLU MLP when the catalog
  gives ``ffn_hidden``, else k = 2 with f = 4h, i.e. 12 h^2); stage 0 also holds the
  token embedding (V h), the last stage the output projection (V h; Megatron keeps an
  untied copy there under pipeline parallelism). Biases and norms (< 0.1 %) are left out.
* Activations A of one micro-batch, held from the start of its F to the end of its B
  (or I), per layer (Korthikanti et al. 2022, "Reducing Activation Recomputation",
  bf16 values, 1-byte dropout masks): ``s b (18 h + 4 f)`` bytes (+2 s b f for a gated
  MLP), i.e. the paper's ``34 s b h`` for f = 4h; with `store_attention_scores` also
  its ``5 a s^2 b`` (no flash attention).
* Split backward (I/W, zero-bubble): I frees every activation except what W needs,
  the inputs of the four linear layers ``2 s b (3h + f)``, and adds the gradients of
  their outputs ``2 s b (5h + f1)`` (f1 = f, or 2f gated): ``M_W = s b (16h + 2f + 2 f1)``
  bytes (the zero-bubble paper's 32 s b h for f = 4h), held from the end of I to the end
  of W.

Peak bytes of a device walk its action list (ops on a device are serial, so list order
is time order): F adds A, B subtracts A, I swaps A for M_W, W subtracts M_W. The peak is
taken after each addition. For schedules without I/W this is `static + peak_inflight x A`
with the exact timer's `peak_inflight`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from testbed.catalog import ModelArch
from testbed.errors import InputError
from testbed.schedule.model import Schedule

GB = 1e9
# mixed-precision Adam: bf16 weights + fp32 master + fp32 Adam m and v + bf16 grads
BYTES_PER_PARAM_MIXED_ADAM = 2 + 4 + 8 + 2


@dataclass(frozen=True, slots=True)
class StageMemory:
    """Bytes of one GPU of a stage: static, per held micro-batch (A), per pending W (M_W)."""

    static_bytes: int
    activation_bytes: int
    wgrad_bytes: int


@dataclass(frozen=True)
class MemoryModel:
    """Per-stage byte model of a pipeline (one GPU of each stage)."""

    stages: tuple[StageMemory, ...]
    source: str = ""

    def peak_bytes(self, schedule: Schedule) -> list[int]:
        """Peak HBM bytes per stage while running `schedule` (see module docstring)."""
        if schedule.stages != len(self.stages):
            raise InputError("schedule", f"has {schedule.stages} stages, memory model "
                             f"{len(self.stages)}")
        v = schedule.virtual_stages
        out = []
        for mem, acts in zip(self.stages, schedule.actions, strict=True):
            a, w = mem.activation_bytes / v, mem.wgrad_bytes / v
            held = peak = 0.0
            for act in acts:
                if act.kind == "F":
                    held += a
                    peak = max(peak, held)
                elif act.kind == "B":
                    held -= a
                elif act.kind == "I":
                    held += w - a
                    peak = max(peak, held)
                else:
                    held -= w
            out.append(mem.static_bytes + round(peak))
        return out

    def fits(self, schedule: Schedule, budget_bytes: int | Sequence[int]) -> bool:
        """Does every stage's peak stay within its budget (one value or one per stage)?"""
        budgets = self.budgets(budget_bytes)
        return all(pk <= b for pk, b in zip(self.peak_bytes(schedule), budgets, strict=True))

    def budgets(self, budget_bytes: int | Sequence[int]) -> list[int]:
        p = len(self.stages)
        if isinstance(budget_bytes, int | float):
            return [int(budget_bytes)] * p
        out = [int(b) for b in budget_bytes]
        if len(out) != p:
            raise InputError("budget_bytes", f"needs 1 or {p} values, got {len(out)}")
        return out

    def microbatch_caps(self, budget_bytes: int | Sequence[int]) -> list[int]:
        """Most micro-batches of activations each stage can hold within its budget (B
        schedules). InputError if a stage cannot hold even one."""
        caps = []
        for s, (mem, b) in enumerate(zip(self.stages, self.budgets(budget_bytes),
                                         strict=True)):
            room = b - mem.static_bytes
            k = room // mem.activation_bytes if mem.activation_bytes else 10**9
            if k < 1:
                raise InputError("budget_bytes", f"stage {s}: {b / GB:.2f} GB cannot hold its "
                                 f"{mem.static_bytes / GB:.2f} GB of weights and optimizer "
                                 f"state plus one micro-batch ({mem.activation_bytes / GB:.2f} GB)")
            caps.append(int(k))
        return caps


def _ffn(arch: ModelArch) -> tuple[int, bool]:
    """(MLP width f, gated?) as testbed.jobs.model reads the catalog."""
    if arch.ffn_hidden is None:
        return 4 * arch.hidden, False
    return arch.ffn_hidden, True


def layer_params(arch: ModelArch) -> int:
    """Weights of one transformer layer: 4 h^2 + k h f (k = 3 gated, else 2)."""
    f, gated = _ffn(arch)
    h = arch.hidden
    return 4 * h * h + (3 if gated else 2) * h * f


def layer_activation_bytes(arch: ModelArch, store_attention_scores: bool = False) -> int:
    """Stored activations of one layer for one micro-batch (34 s b h for f = 4h)."""
    f, gated = _ffn(arch)
    h, sb = arch.hidden, arch.seq_len * arch.micro_batch
    per_token = 18 * h + 4 * f + (2 * f if gated else 0)
    out = sb * per_token
    if store_attention_scores:
        out += 5 * arch.heads * arch.seq_len * sb
    return out


def layer_wgrad_bytes(arch: ModelArch) -> int:
    """What one layer holds between I and W: linear inputs + their output gradients."""
    f, gated = _ffn(arch)
    h, sb = arch.hidden, arch.seq_len * arch.micro_batch
    f1 = 2 * f if gated else f
    return sb * (2 * (3 * h + f) + 2 * (5 * h + f1))


def split_layers(layers: int, stages: int) -> list[int]:
    """Even split; the first ``layers mod stages`` stages get one more layer."""
    base, extra = divmod(layers, stages)
    return [base + (1 if i < extra else 0) for i in range(stages)]


def memory_model(arch: ModelArch, stages: int, tensor_parallel: int = 1, *,
                 store_attention_scores: bool = False,
                 bytes_per_param: int = BYTES_PER_PARAM_MIXED_ADAM) -> MemoryModel:
    """The byte model of `arch` split evenly over `stages` stages of `tensor_parallel` GPUs."""
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise InputError("stages", f"must be an integer >= 1, got {stages}")
    if isinstance(tensor_parallel, bool) or not isinstance(tensor_parallel, int) \
            or tensor_parallel < 1:
        raise InputError("tensor_parallel", f"must be an integer >= 1, got {tensor_parallel}")
    if stages > arch.layers:
        raise InputError("stages", f"{arch.name} has {arch.layers} layers, fewer than "
                         f"{stages} stages")
    t = tensor_parallel
    lp = layer_params(arch)
    la = layer_activation_bytes(arch, store_attention_scores)
    lw = layer_wgrad_bytes(arch)
    emb = arch.vocab * arch.hidden
    out = []
    for s, n in enumerate(split_layers(arch.layers, stages)):
        params = n * lp + (emb if s == 0 else 0) + (emb if s == stages - 1 else 0)
        out.append(StageMemory(static_bytes=params * bytes_per_param // t,
                               activation_bytes=n * la // t, wgrad_bytes=n * lw // t))
    return MemoryModel(tuple(out), source=f"{arch.name}, {stages} stages x TP {t}, "
                       f"{bytes_per_param} B/param")
