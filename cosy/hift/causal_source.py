"""CosyVoice3's harmonic-plus-noise excitation: official `SourceModuleHnNSF` / `SineGen2` with `causal=True`.

As CosyVoice2's (`cosy.hift.source`) except: the phase at frame rate is NEAREST-upsampled (held for each
frame's 480 samples) instead of linearly interpolated, and the additive noise is not drawn per call but
read from a fixed uniform table built at construction (`cosy.hift.noise_tables`), so inference is
deterministic. The initial phases `rand_ini` are added to sample 0 only, which the 1/480 linear
downsampling never reads (it averages samples 239 and 240 of each frame): kept for the record, not applied.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosy.hift.config import CausalHiFTConfig
from cosy.hift.noise_tables import NoiseTables, state_before_source


def causal_harmonic_sines(f0: Tensor, n_harmonics: int, sampling_rate: int, upsample_scale: int,
                          start: int = 0) -> Tensor:
    """f0 (B, T) Hz at frame rate -> sin(phase) (B, (T - start)*scale, n_harmonics + 1), float32, phase held
    per frame; `start`: the first frame wanted (the phase still integrates from frame 0).

    The official upsamples f0 to the sample rate, takes (k f0 / sr) mod 1 per sample, averages back to the
    frame rate (two equal samples: the frame value itself), integrates, and nearest-upsamples: computing at
    frame rate gives the same numbers.
    """
    f0 = f0.float()
    mult = torch.arange(1, n_harmonics + 2, device=f0.device, dtype=torch.float32)
    rad = (f0.unsqueeze(-1) * mult / sampling_rate) % 1  # (B, T, H+1) cycles per sample
    phase = torch.cumsum(rad, dim=1)[:, start:] * 2 * math.pi * upsample_scale  # cheap at frame rate
    return torch.sin(phase).repeat_interleave(upsample_scale, dim=1)


class CausalSourceModule(nn.Module):
    """f0 -> single-channel excitation tanh(Linear(voiced sines + table noise)). Only param: `l_linear`.

    `tables` default to the official ones for `cfg` (replayed from the yaml's sizes); `state` overrides the
    generator state they are drawn from.
    """

    def __init__(self, cfg: CausalHiFTConfig, state: Tensor | None = None):
        super().__init__()
        self.n_harmonics = cfg.nb_harmonics
        self.sampling_rate = cfg.sampling_rate
        self.upsample_scale = cfg.upsample_scale
        self.sine_amp = cfg.nsf_alpha
        self.noise_std = cfg.nsf_sigma
        self.voiced_threshold = cfg.nsf_voiced_threshold
        self.l_linear = nn.Linear(cfg.nb_harmonics + 1, 1)
        state = state_before_source(cfg) if state is None else state
        self.tables = NoiseTables(state, cfg.nb_harmonics + 1, cfg.max_seconds * cfg.sampling_rate)

    def forward(self, f0: Tensor, noise: bool = True, start: int = 0) -> Tensor:
        """f0 (B, T) Hz -> source (B, 1, (T - start)*scale), float32: the excitation of frames start..T-1 (it is
        pointwise per sample, but for the phase, which integrates f0 from frame 0). `noise=False`: the tables
        taken as zeros."""
        sines = causal_harmonic_sines(f0, self.n_harmonics, self.sampling_rate, self.upsample_scale,
                                      start) * self.sine_amp
        uv = (f0[:, start:].float() > self.voiced_threshold).float()
        uv = uv.repeat_interleave(self.upsample_scale, dim=1).unsqueeze(-1)  # (B, L, 1)
        excitation = sines * uv
        if noise:
            # voiced: small noise (sigma); unvoiced: about the sine amplitude; uniform [0, 1) table (official)
            noise_amp = uv * self.noise_std + (1 - uv) * self.sine_amp / 3
            offset = start * self.upsample_scale  # the table is indexed by the sample's place in the utterance
            table = self.tables.sine_waves(offset + sines.size(1), sines.device)[:, offset:].to(sines.dtype)
            excitation = excitation + noise_amp * table
        merged = F.linear(excitation, self.l_linear.weight.float(), self.l_linear.bias.float())
        return torch.tanh(merged).transpose(1, 2)
