"""Band-limited sinc resampling, numerically the resampler the official `load_wav` uses.

The official code calls torchaudio's `transforms.Resample(orig, new)` with its defaults: a Hann-windowed
sinc filter (`lowpass_filter_width` 6 zero crossings, `rolloff` 0.99 of the lower Nyquist rate). We cannot
import torchaudio beside a CPU torch (its PyPI wheel is a CUDA build), so this is the same published
formula over plain torch:

    y[j] = sum_i x[i] * h(i / orig - j / new),  h(t) = w(t) * sinc(base * t) * base / orig

with base = min(orig, new) * rolloff, w a Hann window over +-lowpass_filter_width zero crossings. The rates
are first divided by their gcd so that the filter bank has `new` phases of `2 * width + orig` taps,
applied as one strided conv1d. Like the transform, the bank is built in float64 and used in float32.
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch
import torch.nn.functional as F

LOWPASS_FILTER_WIDTH = 6
ROLLOFF = 0.99


@lru_cache(maxsize=16)
def _sinc_kernel(orig: int, new: int) -> tuple[torch.Tensor, int]:
    """Filter bank (new, 1, 2*width + orig) float32 for the gcd-reduced rates, and `width` (taps each side)."""
    base = min(orig, new) * ROLLOFF
    width = math.ceil(LOWPASS_FILTER_WIDTH * orig / base)
    # Input sample offsets (in input periods) relative to the start of each output phase.
    taps = torch.arange(-width, width + orig, dtype=torch.float64) / orig
    phases = -torch.arange(new, dtype=torch.float64)[:, None] / new
    t = ((phases + taps) * base).clamp(-LOWPASS_FILTER_WIDTH, LOWPASS_FILTER_WIDTH)
    window = torch.cos(t * math.pi / LOWPASS_FILTER_WIDTH / 2) ** 2
    t = t * math.pi
    sinc = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / t)
    kernel = sinc * window * (base / orig)
    return kernel.to(torch.float32).unsqueeze(1), width


def resample(wav: torch.Tensor, orig_sr: int, new_sr: int) -> torch.Tensor:
    """Resample along the last axis: (..., N) float at orig_sr -> (..., ceil(N * new_sr / orig_sr)) float32.

    Same rate returns the input unchanged (as the official code skips the transform).
    """
    if orig_sr <= 0 or new_sr <= 0 or int(orig_sr) != orig_sr or int(new_sr) != new_sr:
        raise ValueError(f"sample rates must be positive integers, got {orig_sr} and {new_sr}")
    if orig_sr == new_sr:
        return wav
    if not wav.is_floating_point():
        raise TypeError(f"resample needs a floating-point waveform, got {wav.dtype}")
    g = math.gcd(int(orig_sr), int(new_sr))
    orig, new = int(orig_sr) // g, int(new_sr) // g
    kernel, width = _sinc_kernel(orig, new)
    shape = wav.shape
    x = wav.reshape(-1, shape[-1]).to(torch.float32)
    n = x.shape[-1]
    # Zero padding: `width` taps of history before, and one extra input period after for the last phases.
    x = F.pad(x, (width, width + orig))
    y = F.conv1d(x[:, None], kernel.to(x.device), stride=orig)  # (B, new, frames): phase-major
    y = y.transpose(1, 2).reshape(x.shape[0], -1)
    target = math.ceil(new * n / orig)
    return y[:, :target].reshape(*shape[:-1], -1)
