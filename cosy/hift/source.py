"""Harmonic-plus-noise excitation of HiFT: the official `SourceModuleHnNSF` with its `SineGen2` branch.

CosyVoice2 (24 kHz) uses SineGen2: the phase of each harmonic is integrated at the mel frame rate and then
linearly interpolated up to the sample rate, instead of a per-sample cumulative sum (float32 drift).

Randomness. The official code draws from the global RNG: `torch.rand` for the initial phases of harmonics
1..H and `torch.randn_like` for the additive noise (plus a noise branch that inference discards). The initial
phases are dead in the official code: they are added to sample 0 only, and the linear 1/480 downsampling
reads samples 239/240 of each frame, so they never reach the output. We therefore draw only the additive noise,
from an optional per-call `torch.Generator` (global RNG untouched when one is given); `noise=False` gives
the deterministic source the golden `hift.source_zero_noise` case was made with.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from cosy.hift.config import HiFTConfig


def harmonic_sines(f0: torch.Tensor, n_harmonics: int, sampling_rate: int, upsample_scale: int) -> torch.Tensor:
    """SineGen2 phase: f0 (B, T) Hz at frame rate -> sin(phase) (B, T*scale, n_harmonics + 1), float32.

    Equals the official upsample-then-downsample path bit for bit: after nearest upsampling, the linear
    1/scale downsampling averages two equal samples, i.e. returns the frame value itself.
    """
    f0 = f0.float()
    mult = torch.arange(1, n_harmonics + 2, device=f0.device, dtype=torch.float32)
    # Cycles per sample for each harmonic; the integer part is irrelevant to the phase.
    rad = (f0.unsqueeze(-1) * mult / sampling_rate) % 1  # (B, T, H+1)
    phase = torch.cumsum(rad, dim=1) * 2 * math.pi  # phase at frame rate, in units of 1/scale cycles
    # Linear interpolation to the sample rate (align_corners=False, like the official).
    phase = F.interpolate(phase.transpose(1, 2) * upsample_scale, scale_factor=upsample_scale, mode="linear")
    return torch.sin(phase).transpose(1, 2)  # (B, L, H+1)


class SourceModuleHnNSF(nn.Module):
    """f0 -> single-channel excitation: tanh(Linear(voiced harmonics + noise)). Only param: `l_linear`."""

    def __init__(self, cfg: HiFTConfig):
        super().__init__()
        self.n_harmonics = cfg.nb_harmonics
        self.sampling_rate = cfg.sampling_rate
        self.upsample_scale = cfg.upsample_scale
        self.sine_amp = cfg.nsf_alpha
        self.noise_std = cfg.nsf_sigma
        self.voiced_threshold = cfg.nsf_voiced_threshold
        self.l_linear = nn.Linear(cfg.nb_harmonics + 1, 1)

    def forward(
        self, f0: torch.Tensor, generator: torch.Generator | None = None, noise: bool = True
    ) -> torch.Tensor:
        """f0 (B, T) Hz -> source (B, 1, T*scale), float32.

        `generator` (on f0's device) drives the additive noise; None uses the global RNG like the official.
        `noise=False` drops the noise (deterministic source).
        """
        sines = harmonic_sines(f0, self.n_harmonics, self.sampling_rate, self.upsample_scale) * self.sine_amp
        uv = (f0.float() > self.voiced_threshold).float()
        uv = uv.repeat_interleave(self.upsample_scale, dim=1).unsqueeze(-1)  # (B, L, 1), nearest upsampling
        excitation = sines * uv
        if noise:
            # Voiced: small noise (sigma); unvoiced: noise of about the sine amplitude.
            noise_amp = uv * self.noise_std + (1 - uv) * self.sine_amp / 3
            eps = torch.randn(sines.shape, generator=generator, device=sines.device, dtype=sines.dtype)
            excitation = excitation + noise_amp * eps
        # The merge runs in float32 whatever the module dtype: the source feeds an STFT.
        merged = F.linear(excitation, self.l_linear.weight.float(), self.l_linear.bias.float())
        return torch.tanh(merged).transpose(1, 2)  # (B, 1, L)
