"""Built-in catalogue of LLM architectures and GPU types used by pipeline jobs.

Figures are public architecture constants (papers / model cards) and vendor peak
dense BF16 throughput; the MFU applied to them is a modelling choice of the job
model, not of this table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelArch:
    """A transformer architecture: enough to size compute and activations."""

    name: str
    layers: int
    hidden: int
    seq_len: int
    micro_batch: int = 1
    bytes_per_value: int = 2
    heads: int = 32
    ffn_hidden: int | None = None
    vocab: int = 50257

    @property
    def activation_bytes(self) -> int:
        """Bytes of one micro-batch's activation at a stage boundary."""
        return self.micro_batch * self.seq_len * self.hidden * self.bytes_per_value


@dataclass(frozen=True)
class GPUType:
    """A GPU (or NPU) type: peak dense BF16 TFLOP/s and board power."""

    name: str
    peak_tflops: float
    power_w: float
    memory_gb: float


MODELS: dict[str, ModelArch] = {
    m.name: m
    for m in (
        ModelArch("gpt3-175b", layers=96, hidden=12288, seq_len=2048, heads=96),
        ModelArch("gpt3-6.7b", layers=32, hidden=4096, seq_len=2048, heads=32),
        ModelArch("llama2-70b", layers=80, hidden=8192, seq_len=4096, heads=64,
                  ffn_hidden=28672, vocab=32000),
        ModelArch("llama2-13b", layers=40, hidden=5120, seq_len=4096, heads=40,
                  ffn_hidden=13824, vocab=32000),
        ModelArch("llama2-7b", layers=32, hidden=4096, seq_len=4096, heads=32,
                  ffn_hidden=11008, vocab=32000),
    )
}

GPUS: dict[str, GPUType] = {
    g.name: g
    for g in (
        GPUType("h100", peak_tflops=989.0, power_w=700.0, memory_gb=80.0),
        GPUType("h200", peak_tflops=989.0, power_w=700.0, memory_gb=141.0),
        GPUType("a100", peak_tflops=312.0, power_w=400.0, memory_gb=80.0),
        GPUType("v100", peak_tflops=125.0, power_w=300.0, memory_gb=32.0),
        GPUType("b200", peak_tflops=2250.0, power_w=1000.0, memory_gb=192.0),
        GPUType("ascend-910b", peak_tflops=320.0, power_w=400.0, memory_gb=64.0),
    )
}
