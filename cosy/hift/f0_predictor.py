"""F0 predictor of HiFT (official `ConvRNNF0Predictor`): 5 x (Conv1d k3 + ELU), Linear, abs.

Despite the name there is no RNN. Weight norm of the convs is folded at load (see `weights.py`).
"""
from __future__ import annotations

import torch
from torch import nn

from cosy.hift.config import HiFTConfig


class ConvRNNF0Predictor(nn.Module):
    def __init__(self, cfg: HiFTConfig):
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(5):
            c_in = cfg.f0_in_channels if i == 0 else cfg.f0_cond_channels
            layers += [nn.Conv1d(c_in, cfg.f0_cond_channels, kernel_size=3, padding=1), nn.ELU()]
        # Sequential indices 0, 2, 4, 6, 8 hold the convs, as in the official keys `condnet.N`.
        self.condnet = nn.Sequential(*layers)
        self.classifier = nn.Linear(cfg.f0_cond_channels, cfg.f0_num_class)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """mel (B, 80, T) -> f0 (B, T) in Hz (num_class 1)."""
        h = self.condnet(mel).transpose(1, 2)  # (B, T, C)
        return torch.abs(self.classifier(h).squeeze(-1))
