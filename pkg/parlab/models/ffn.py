"""The SwiGLU feed-forward layer that Llama-style blocks and every MoE expert are made of."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SwiGLU"]


class SwiGLU(nn.Module):
    """The feed-forward layer: ``down(silu(gate(x)) * up(x))``, d_model -> d_ff -> d_model."""

    def __init__(self, d_model: int, d_ff: int, bias: bool = False):
        super().__init__()
        d, f = d_model, d_ff
        self.gate_proj = nn.Linear(d, f, bias=bias)
        self.up_proj = nn.Linear(d, f, bias=bias)
        self.down_proj = nn.Linear(f, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
