"""`model` mode: a small GPT-style transformer split into pipeline stages, trained on
synthetic next-token data (a fixed affine recurrence with noise, so the loss falls)."""

from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import nn

from testbed.schedule.model import Action
from workloads.plan import JobPlan, TinyGPTConfig

NOISE = 0.05  # share of tokens replaced by random ones


def synthetic_batch(cfg: TinyGPTConfig, it: int, mb: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(inputs, targets) of one micro-batch: x[t+1] = (5 x[t] + 3) mod V, some noise.

    Seeded by (seed, iteration, micro-batch), so the first and the last stage build
    the same batch without sending tokens.
    """
    gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + it * 1009 + mb)
    n, v = cfg.seq_len + 1, cfg.vocab
    seq = torch.empty(cfg.micro_batch, n, dtype=torch.long)
    seq[:, 0] = torch.randint(0, v, (cfg.micro_batch,), generator=gen)
    for t in range(1, n):
        seq[:, t] = (5 * seq[:, t - 1] + 3) % v
    noise = torch.rand(cfg.micro_batch, n, generator=gen) < NOISE
    seq[noise] = torch.randint(0, v, (int(noise.sum()),), generator=gen)
    return seq[:, :-1], seq[:, 1:]


class Block(nn.Module):
    """Pre-norm transformer block with causal self-attention."""

    def __init__(self, cfg: TinyGPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = nn.MultiheadAttention(cfg.hidden, cfg.heads, batch_first=True)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.mlp = nn.Sequential(nn.Linear(cfg.hidden, 4 * cfg.hidden), nn.GELU(),
                                 nn.Linear(4 * cfg.hidden, cfg.hidden))
        mask = torch.triu(torch.full((cfg.seq_len, cfg.seq_len), -math.inf), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=self.mask, need_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


def layer_split(layers: int, stages: int) -> list[int]:
    base, extra = divmod(layers, stages)
    return [base + (1 if i < extra else 0) for i in range(stages)]


class StageModule(nn.Module):
    """Stage `rank` of `stages`: embeddings on the first, head and loss on the last."""

    def __init__(self, cfg: TinyGPTConfig, rank: int, stages: int) -> None:
        super().__init__()
        torch.manual_seed(cfg.seed * 7919 + rank)
        self.first, self.last = rank == 0, rank == stages - 1
        if self.first:
            self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
            self.pos = nn.Parameter(torch.zeros(1, cfg.seq_len, cfg.hidden))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(layer_split(cfg.layers,
                                                                          stages)[rank]))
        if self.last:
            self.ln_f = nn.LayerNorm(cfg.hidden)
            self.head = nn.Linear(cfg.hidden, cfg.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.tok(x) + self.pos
        for b in self.blocks:
            x = b(x)
        if self.last:
            x = self.head(self.ln_f(x))
        return x


class ModelProgram:
    """Real forward/backward of one stage; gradients accumulate over micro-batches."""

    def __init__(self, plan: JobPlan, rank: int) -> None:
        assert plan.model is not None
        self.cfg = plan.model
        self.m = plan.microbatches
        self.module = StageModule(self.cfg, rank, plan.stages)
        self.opt = torch.optim.Adam(self.module.parameters(), lr=self.cfg.lr)
        self.first, self.last = self.module.first, self.module.last
        self._held: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
        self._losses: list[float] = []

    def recv_buffer(self, direction: str, virtual_stage: int) -> torch.Tensor:
        c = self.cfg
        return torch.empty(c.micro_batch, c.seq_len, c.hidden)

    def forward(self, it: int, action: Action, virtual_stage: int,
                inp: torch.Tensor | None) -> tuple[torch.Tensor | None, float]:
        t0 = time.monotonic()
        mb = action.microbatch
        if self.first:
            x: torch.Tensor | None = None
            out = self.module(synthetic_batch(self.cfg, it, mb)[0])
        else:
            assert inp is not None
            x = inp.clone().requires_grad_(True)
            out = self.module(x)
        if self.last:
            targets = synthetic_batch(self.cfg, it, mb)[1]
            loss = nn.functional.cross_entropy(out.reshape(-1, self.cfg.vocab),
                                               targets.reshape(-1))
            self._losses.append(float(loss.detach()))
            out = loss / self.m
        self._held[mb] = (x, out)
        send = None if self.last else out.detach()
        return send, time.monotonic() - t0

    def backward(self, it: int, action: Action, virtual_stage: int,
                 grad: torch.Tensor | None) -> tuple[torch.Tensor | None, float]:
        t0 = time.monotonic()
        x, out = self._held.pop(action.microbatch)
        if self.last:
            out.backward()
        else:
            assert grad is not None
            out.backward(grad)
        send = None if x is None else x.grad
        return send, time.monotonic() - t0

    def weight(self, it: int, action: Action, virtual_stage: int) -> float:
        raise RuntimeError("model mode does not split backward (W actions)")

    def end_iteration(self, it: int) -> dict[str, Any]:
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        out: dict[str, Any] = {}
        if self.last and self._losses:
            out["loss"] = sum(self._losses) / len(self._losses)
        self._losses = []
        return out
