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


# The most filter-bank entries (phases x taps) built for a pair of rates: rates whose gcd is small (24000 and
# 44101 Hz: a bank of 44101 x 24014) are resampled tap by tap instead (`_resample_direct`), the same formula
DIRECT_BLOCK = 1 << 16  # output samples per step of `_resample_direct`
MAX_BANK = 1 << 20


def _width(orig: int, new: int) -> int:
    """Taps on each side of an output sample, in input samples (gcd-reduced rates)."""
    return math.ceil(LOWPASS_FILTER_WIDTH * orig / (min(orig, new) * ROLLOFF))


def _taps(phases: torch.Tensor, taps: torch.Tensor, orig: int, new: int) -> torch.Tensor:
    """The filter h at output phases p (tensor) and tap offsets m (from `width` input samples before the
    phase's period, broadcast against them), float64 -> float32."""
    base = min(orig, new) * ROLLOFF
    t = ((-phases / new + (taps - _width(orig, new)) / orig) * base).clamp(-LOWPASS_FILTER_WIDTH,
                                                                           LOWPASS_FILTER_WIDTH)
    window = torch.cos(t * math.pi / LOWPASS_FILTER_WIDTH / 2) ** 2
    t = t * math.pi
    sinc = torch.where(t == 0, torch.ones_like(t), torch.sin(t) / t)
    return (sinc * window * (base / orig)).to(torch.float32)


@lru_cache(maxsize=16)
def _sinc_kernel(orig: int, new: int) -> tuple[torch.Tensor, int]:
    """Filter bank (new, 1, 2*width + orig) float32 for the gcd-reduced rates, and `width` (taps each side)."""
    width = _width(orig, new)
    phases = torch.arange(new, dtype=torch.float64)[:, None]
    taps = torch.arange(2 * width + orig, dtype=torch.float64)
    return _taps(phases, taps, orig, new).unsqueeze(1), width


def _resample_direct(x: torch.Tensor, orig: int, new: int) -> torch.Tensor:
    """`resample` of (B, N) float32 without a filter bank: each output sample's 2 * width + 1 taps (all of its
    filter's support) computed for it, a block of outputs at a time; as the bank's values, summed in
    another order."""
    width, n = _width(orig, new), x.shape[-1]
    padded = F.pad(x, (width, width + orig))
    out = []
    for start in range(0, math.ceil(new * n / orig), DIRECT_BLOCK):
        j = torch.arange(start, min(start + DIRECT_BLOCK, math.ceil(new * n / orig)), dtype=torch.int64)
        k, p = j // new, j % new
        first = p * orig // new  # the first tap in the phase's row of the bank that can be nonzero
        m = first[:, None] + torch.arange(2 * width + 1, dtype=torch.int64)  # (J, taps), within the row
        h = _taps(p[:, None].double(), m.double(), orig, new)
        out.append((padded[:, k[:, None] * orig + m] * h).sum(-1))
    return torch.cat(out, dim=-1) if out else x.new_zeros(x.shape[0], 0)


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
    shape = wav.shape
    x = wav.reshape(-1, shape[-1]).to(torch.float32)
    n = x.shape[-1]
    if new * (2 * _width(orig, new) + orig) > MAX_BANK:
        return _resample_direct(x, orig, new).reshape(*shape[:-1], -1)
    kernel, width = _sinc_kernel(orig, new)
    # Zero padding: `width` taps of history before, and one extra input period after for the last phases.
    x = F.pad(x, (width, width + orig))
    y = F.conv1d(x[:, None], kernel.to(x.device), stride=orig)  # (B, new, frames): phase-major
    y = y.transpose(1, 2).reshape(x.shape[0], -1)
    target = math.ceil(new * n / orig)
    return y[:, :target].reshape(*shape[:-1], -1)
