"""Resampling between rates whose gcd is small: the official filter bank has one row per output phase, so
24000 -> 44101 Hz (an output `sample_rate` every API accepts, 8000-48000) or a prompt recorded at 44101 Hz
asked for a bank of 44101 x 24014 taps: 8.5 GB, refused by the allocator or the machine (8001 Hz: 2.8 s of
CPU per request, and a 170 MB bank kept in the cache). Such rates are resampled tap by tap, the same formula
(`cosy.audio.resample`)."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

from cosy.audio.resample import MAX_BANK, _resample_direct, _width, resample

pytestmark = pytest.mark.quick

ODD = [(24000, 44101), (44101, 16000), (44101, 24000), (24000, 8001), (47999, 24000), (24000, 47999)]


def signal(rate: int, seconds: float) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    rng = np.random.default_rng(0)
    return (0.5 * np.sin(2 * np.pi * 440 * t) + 0.1 * rng.standard_normal(len(t))).astype(np.float32)


def formula(x: np.ndarray, orig: int, new: int) -> np.ndarray:
    """y[j] = sum_i x[i] h((i/orig - j/new) * base), Hann-windowed sinc over +-6 zero crossings, in float64."""
    base = min(orig, new) * 0.99
    t = (np.arange(len(x))[None, :] / orig - np.arange(math.ceil(len(x) * new / orig))[:, None] / new) * base
    h = np.where(np.abs(t) < 6, np.cos(np.pi * t / 12) ** 2 * np.sinc(t), 0.0) * base / orig
    return h @ x.astype(np.float64)


@pytest.mark.parametrize("rates", ODD, ids=[f"{a}-{b}" for a, b in ODD])
def test_rates_with_a_small_gcd_follow_the_formula_quickly(rates):
    orig, new = rates
    g = math.gcd(orig, new)
    assert new // g * (2 * _width(orig // g, new // g) + orig // g) > MAX_BANK  # (the tap-by-tap path)
    x = signal(orig, 0.05)
    ours = resample(torch.from_numpy(x), orig, new)
    assert ours.dtype == torch.float32
    np.testing.assert_allclose(ours.numpy(), formula(x, orig, new), atol=2e-6)
    start = time.process_time()
    second = resample(torch.from_numpy(signal(orig, 1.0))[None], orig, new)
    assert second.shape == (1, math.ceil(orig * new / orig)) and time.process_time() - start < 5


@pytest.mark.parametrize("rates", [(22050, 16000), (24000, 16000), (16000, 24000), (44100, 16000)])
def test_tap_by_tap_equals_the_bank(rates):
    """Where the bank is small it is used (the official numbers); the direct path gives the same sums."""
    orig, new = rates
    g = math.gcd(orig, new)
    x = torch.from_numpy(signal(orig, 0.3))[None]
    bank = resample(x, orig, new)
    direct = _resample_direct(x, orig // g, new // g)
    assert direct.shape == bank.shape
    assert float((direct - bank).abs().max()) < 1e-6
