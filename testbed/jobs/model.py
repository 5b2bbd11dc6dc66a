"""Job model: per-stage compute time from FLOPs, activation size, energy and electricity cost.

Formulas (documented in docs/jobs.md):

* Forward FLOPs of one transformer layer for one micro-batch of B sequences of s tokens:
  ``2 * B * s * P_layer + 4 * B * s^2 * h`` where ``P_layer = 4 h^2 + k * h * ffn`` is the
  layer's weight count (k = 3 for a gated/SwiGLU MLP when ``ffn_hidden`` is given, else
  k = 2 with ffn = 4h, i.e. ``P_layer = 12 h^2``; the GPT-3 case gives Megatron's
  ``24 B s h^2 (1 + s / 6h)``). The last stage also runs the logits: ``2 B s h V``.
* Backward = 2 x forward (weight + input gradients).
* Stage time = FLOPs / (gpus_per_stage * peak_tflops * 1e12 * MFU); layers are split as
  evenly as possible (the first ``layers mod p`` stages get one more).
* Activation bytes per micro-batch = micro_batch * seq_len * hidden * bytes_per_value.
* Energy: every GPU a job holds draws its board power for the whole run; a DC's PUE
  multiplies it (``DEFAULT_PUE``). Cost integrates the DC's hourly price curve (or flat
  price) over the run.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from testbed.catalog import GPUS, MODELS, GPUType, ModelArch
from testbed.spec.models import ModelSpec

DEFAULT_MFU = 0.4  # model FLOPs utilisation assumed for every stage (Megatron-scale typical)
DEFAULT_PUE = 1.2  # datacenter power usage effectiveness applied to GPU board power
BACKWARD_FACTOR = 2.0


def model_catalog(extra: Sequence[ModelSpec] = ()) -> dict[str, ModelArch]:
    """The built-in catalogue plus the spec's custom models."""
    cat = dict(MODELS)
    for m in extra:
        cat[m.name] = ModelArch(m.name, layers=m.layers, hidden=m.hidden, seq_len=m.seq_len,
                                micro_batch=m.micro_batch, bytes_per_value=m.bytes_per_value,
                                heads=m.heads, ffn_hidden=m.ffn_hidden, vocab=m.vocab)
    return cat


def layer_forward_flops(arch: ModelArch) -> float:
    """Forward FLOPs of one layer for one micro-batch."""
    h, s, b = arch.hidden, arch.seq_len, arch.micro_batch
    if arch.ffn_hidden is None:
        p_layer = 12.0 * h * h
    else:
        p_layer = 4.0 * h * h + 3.0 * h * arch.ffn_hidden
    return 2.0 * b * s * p_layer + 4.0 * b * s * s * h


def logits_forward_flops(arch: ModelArch) -> float:
    return 2.0 * arch.micro_batch * arch.seq_len * arch.hidden * arch.vocab


def layers_per_stage(layers: int, stages: int) -> list[int]:
    """Even split; the first ``layers mod stages`` stages get one more layer."""
    if stages < 1:
        raise ValueError("stages must be >= 1")
    base, extra = divmod(layers, stages)
    return [base + (1 if i < extra else 0) for i in range(stages)]


@dataclass(frozen=True)
class StageTimes:
    """Per-stage forward and backward time of one micro-batch, in ms."""

    forward_ms: tuple[float, ...]
    backward_ms: tuple[float, ...]


def stage_times(arch: ModelArch, gpus: Sequence[GPUType], gpus_per_stage: int,
                mfu: float = DEFAULT_MFU) -> StageTimes:
    """Forward/backward ms of each stage; ``gpus[i]`` is stage i's GPU type."""
    p = len(gpus)
    split = layers_per_stage(arch.layers, p)
    lf = layer_forward_flops(arch)
    fwd: list[float] = []
    for i, (n_layers, gpu) in enumerate(zip(split, gpus, strict=True)):
        flops = n_layers * lf + (logits_forward_flops(arch) if i == p - 1 else 0.0)
        rate = gpus_per_stage * gpu.peak_tflops * 1e12 * mfu  # FLOP/s
        fwd.append(1e3 * flops / rate)
    return StageTimes(tuple(fwd), tuple(BACKWARD_FACTOR * f for f in fwd))


def activation_mb(arch: ModelArch) -> float:
    """Activation (and gradient) of one micro-batch at a stage boundary, in MB (1e6 bytes)."""
    return arch.activation_bytes / 1e6


def gpu_type(name: str) -> GPUType:
    return GPUS[name]


def price_integral_usd_per_kwh_h(flat_usd_per_kwh: float, curve: Sequence[float] | None,
                                 start_s: float, end_s: float) -> float:
    """Integral of the electricity price over [start_s, end_s], in USD/kWh x hours.

    With a curve, hour-of-day = floor(t / 3600) mod 24 (simulation time starts at 00:00).
    """
    if end_s <= start_s:
        return 0.0
    if curve is None:
        return flat_usd_per_kwh * (end_s - start_s) / 3600.0
    total = 0.0
    full_day = sum(curve)
    t = start_s
    days = math.floor((end_s - start_s) / 86400.0)
    if days > 0:  # whole days at once (long jobs)
        total += days * full_day
        t += days * 86400.0
    while t < end_s - 1e-9:
        hour = math.floor(t / 3600.0)
        nxt = min(end_s, (hour + 1) * 3600.0)
        total += curve[hour % 24] * (nxt - t) / 3600.0
        t = nxt
    return total


def mean_price_usd_per_kwh(flat_usd_per_kwh: float, curve: Sequence[float] | None,
                           start_s: float, duration_s: float) -> float:
    if duration_s <= 0:
        return flat_usd_per_kwh if curve is None else curve[math.floor(start_s / 3600) % 24]
    return price_integral_usd_per_kwh_h(flat_usd_per_kwh, curve, start_s,
                                        start_s + duration_s) * 3600.0 / duration_s


def energy_kwh(gpus: int, power_w: float, duration_s: float, pue: float = DEFAULT_PUE) -> float:
    """Energy of ``gpus`` boards at ``power_w`` for ``duration_s`` (times PUE), in kWh."""
    return gpus * power_w * pue * duration_s / 3.6e6
