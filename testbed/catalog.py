"""Built-in catalogue of LLM architectures and GPU types used by pipeline jobs, and the
GSNR each modulation format needs (optical.qot: gnpy).

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


# Pre-FEC bit error ratio a format must reach: the 7 % overhead hard-decision FEC threshold
# (ITU-T G.975.1, appendix I.9 code), the usual threshold in the QoT-aware RMSA literature.
PRE_FEC_BER = 3.8e-3

# GSNR (dB, in the signal bandwidth, i.e. SNR per symbol, what GNPy's `snr` is) each format
# needs to reach PRE_FEC_BER on an AWGN channel with Gray coding, no implementation penalty
# (put that in optical.gsnr_margin_db). Source: the textbook closed forms (J. G. Proakis and
# M. Salehi, Digital Communications, 5th ed., 2008, sec. 4.3): BPSK BER = Q(sqrt(2 SNR));
# QPSK BER = Q(sqrt(SNR)); M-QAM BER ~= 4/log2(M) (1 - 1/sqrt(M)) Q(sqrt(3 SNR / (M - 1)))
# (exact for square M, the usual approximation for 8QAM and 32QAM). tests/test_qot.py
# recomputes every entry from these formulas with scipy.
REQUIRED_GSNR_DB: dict[str, float] = {
    "BPSK": 5.52,
    "QPSK": 8.53,
    "8QAM": 12.04,
    "16QAM": 15.19,
    "32QAM": 18.19,
    "64QAM": 21.12,
}
