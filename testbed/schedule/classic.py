"""Fixed-order schedules: GPipe, 1F1B (optionally with chosen warm-ups), interleaved 1F1B."""

from __future__ import annotations

from collections.abc import Sequence

from testbed.errors import InputError
from testbed.schedule.model import Action, PipelineProblem, Schedule


def gpipe(problem: PipelineProblem) -> Schedule:
    """All forwards, then all backwards, in micro-batch order."""
    m = problem.microbatches
    row = tuple(Action("F", j) for j in range(m)) + tuple(Action("B", j) for j in range(m))
    return Schedule("gpipe", tuple(row for _ in range(problem.stages)))


def one_f_one_b_rows(m: int, warmups: Sequence[int]) -> list[tuple[Action, ...]]:
    """Per stage: `w` warm-up forwards, then alternate F/B, then the remaining backwards."""
    rows = []
    for w in warmups:
        w = max(0, min(int(w), m))
        row = [Action("F", j) for j in range(w)]
        for i in range(m - w):
            row += [Action("F", w + i), Action("B", i)]
        row += [Action("B", j) for j in range(m - w, m)]
        rows.append(tuple(row))
    return rows


def deadlock_free_warmups(warmups: Sequence[int]) -> list[int]:
    """Clamp so that no stage warms up more than the stage before it.

    With 1F1B-shaped orders, stage s+1 needs w[s+1]+1 forwards before its first
    backward while stage s emits only w[s]+1 before it waits for a gradient, so
    w[s+1] <= w[s] is needed to avoid deadlock.
    """
    out = [int(w) for w in warmups]
    for s in range(1, len(out)):
        out[s] = min(out[s], out[s - 1])
    return out


def one_f_one_b(problem: PipelineProblem) -> Schedule:
    """Classic 1F1B: stage s does min(p-s-1, m) warm-up forwards.

    Under a memory cap K the warm-up is clipped to K-1 (then at most K activations
    are held), which keeps the schedule deadlock-free.
    """
    p, m = problem.stages, problem.microbatches
    warm = []
    for s in range(p):
        w = min(p - s - 1, m)
        cap = problem.caps[s]
        if cap is not None:
            w = min(w, cap - 1)
        warm.append(w)
    warm = deadlock_free_warmups(warm)
    return Schedule("1f1b", tuple(one_f_one_b_rows(m, warm)), info={"warmup": warm})


def interleaved_1f1b(problem: PipelineProblem, virtual_stages: int = 2) -> Schedule:
    """Megatron's interleaved 1F1B with `virtual_stages` model chunks per device.

    Device d holds chunks c = 0..v-1, which are virtual stages c*p + d. Micro-batches
    go in groups of p: forward i on a device is micro-batch (i // (p*v))*p + i % p of
    chunk (i // p) % v; backwards walk the chunks in reverse. Warm-up on device d is
    (p - d - 1) * 2 + (v - 1) * p forwards. Needs m to be a multiple of p (as Megatron).
    """
    p, m, v = problem.stages, problem.microbatches, int(virtual_stages)
    if v < 1:
        raise InputError("virtual_stages", f"must be >= 1, got {virtual_stages}")
    if v > 1 and m % p != 0:
        raise InputError("microbatches", f"interleaved-1f1b needs micro-batches to be a "
                         f"multiple of the stages ({p}), got {m}")
    total = m * v

    def fwd(i: int) -> Action:
        return Action("F", (i // (p * v)) * p + i % p, (i // p) % v)

    def bwd(i: int) -> Action:
        return Action("B", (i // (p * v)) * p + i % p, v - 1 - (i // p) % v)

    rows = []
    for d in range(p):
        if v == 1:
            warm = min(p - d - 1, m)
        else:
            warm = min((p - d - 1) * 2 + (v - 1) * p, total)
        row = [fwd(i) for i in range(warm)]
        for i in range(total - warm):
            row += [fwd(warm + i), bwd(i)]
        row += [bwd(i) for i in range(total - warm, total)]
        rows.append(tuple(row))
    return Schedule("interleaved-1f1b", tuple(rows), virtual_stages=v,
                    info={"virtual_stages": v})
