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


class CausalConvRNNF0Predictor(nn.Module):
    """CosyVoice3's f0 predictor (official `CausalConvRNNF0Predictor`): a first conv of kernel
    f0_look_right + 1 that looks that many frames to the RIGHT, then four left-padded k3 convs, ELU after
    each, Linear, abs.

    Built in float64: the official casts this module and its input to float64 at every call (its output
    feeds a phase integral, where float32 rounding would show).
    """

    def __init__(self, cfg: HiFTConfig, look_right: int = 3):
        super().__init__()
        self.look_right = look_right
        c = cfg.f0_cond_channels
        layers: list[nn.Module] = [nn.Conv1d(cfg.f0_in_channels, c, kernel_size=look_right + 1), nn.ELU()]
        for _ in range(4):
            layers += [nn.Conv1d(c, c, kernel_size=3), nn.ELU()]
        self.condnet = nn.Sequential(*layers)  # convs at 0, 2, 4, 6, 8 as in the official keys
        self.classifier = nn.Linear(c, cfg.f0_num_class)
        self.double()

    def forward(self, mel: torch.Tensor, finalize: bool = True) -> torch.Tensor:
        """mel (B, 80, T) -> f0 (B, T) float64 Hz; not final: the last look_right frames are context only
        and get no f0 -> (B, T - look_right)."""
        x = mel.to(torch.float64)
        if finalize:  # no future frames: zeros
            x = torch.nn.functional.pad(x, (0, self.look_right))
        x = self.condnet[1](self.condnet[0](x))
        for i in range(2, len(self.condnet), 2):
            conv, act = self.condnet[i], self.condnet[i + 1]
            x = act(conv(torch.nn.functional.pad(x, (conv.kernel_size[0] - 1, 0))))
        return torch.abs(self.classifier(x.transpose(1, 2)).squeeze(-1))
