"""Prompt hygiene on enrollment (cosy.prompt.hygiene): deterministic, each step checked on real signals."""
from __future__ import annotations

import numpy as np
import pytest

from cosy.prompt.hygiene import Hygiene, PromptRejected, clean

pytestmark = pytest.mark.quick

RATE = 16000


def speech(seconds: float, level: float = 0.1, seed: int = 0) -> np.ndarray:
    """Voiced-like audio: a 150 Hz tone with harmonics under a syllable envelope, plus a little noise."""
    t = np.arange(int(seconds * RATE)) / RATE
    rng = np.random.default_rng(seed)
    tone = sum(np.sin(2 * np.pi * 150 * k * t) / k for k in range(1, 6))
    envelope = 0.6 + 0.4 * np.sin(2 * np.pi * 4 * t)
    x = tone * envelope + 0.05 * rng.standard_normal(len(t))
    return (level * x / np.abs(x).max()).astype(np.float32)


def silence(seconds: float, level: float = 1e-4, seed: int = 1) -> np.ndarray:
    return (level * np.random.default_rng(seed).standard_normal(int(seconds * RATE))).astype(np.float32)


def rms_db(x: np.ndarray) -> float:
    return 20 * np.log10(np.sqrt(np.mean(np.square(x, dtype=np.float64))))


def test_leading_and_trailing_silence_is_trimmed_to_a_short_margin():
    audio = np.concatenate([silence(1.5), speech(2.0), silence(2.0)])
    out, report = clean(audio, RATE, Hygiene())
    kept = len(out) / RATE
    assert 2.0 <= kept <= 2.0 + 2 * Hygiene().margin + 0.05, kept
    assert report["trimmed_start"] == pytest.approx(1.5 - Hygiene().margin, abs=0.03)
    assert report["trimmed_end"] == pytest.approx(2.0 - Hygiene().margin, abs=0.03)


def test_loudness_is_normalized_to_the_target_and_never_clips():
    quiet, loud = speech(3.0, level=0.02), speech(3.0, level=0.9)
    a, ra = clean(quiet, RATE, Hygiene())
    b, rb = clean(loud, RATE, Hygiene())
    assert ra["gain_db"] > 0 > rb["gain_db"]
    for x in (a, b):
        assert abs(rms_db(x) - Hygiene().target_db) < 1.0 or np.abs(x).max() == pytest.approx(Hygiene().peak, 1e-3)
        assert np.abs(x).max() <= Hygiene().peak + 1e-6


def test_the_same_prompt_gives_the_same_bytes():
    audio = np.concatenate([silence(0.5), speech(2.5, 0.05), silence(0.7)])
    a, ra = clean(audio.copy(), RATE, Hygiene())
    b, rb = clean(audio.copy(), RATE, Hygiene())
    assert a.tobytes() == b.tobytes() and ra == rb


def test_clipped_and_near_silent_prompts_are_refused_with_the_reason():
    clipped = np.clip(speech(3.0, level=3.0), -1.0, 1.0)
    with pytest.raises(PromptRejected, match="clipped: .* of the samples are at full scale"):
        clean(clipped, RATE, Hygiene())
    with pytest.raises(PromptRejected, match="near-silent: its loudest .* is -[0-9]+ dBFS"):
        clean(speech(3.0, level=0.002), RATE, Hygiene())
    with pytest.raises(PromptRejected, match="near-silent"):
        clean(np.zeros(3 * RATE, np.float32), RATE, Hygiene())


def test_a_prompt_over_the_cap_is_refused_or_cut_at_a_pause():
    long = np.concatenate([speech(14.0, seed=2), silence(0.6), speech(12.0, seed=3), silence(0.6),
                           speech(8.0, seed=4)])  # 35.2 s, pauses at 14.0-14.6 and 26.6-27.2
    with pytest.raises(PromptRejected, match="35.2 s; the limit is 30 s .*too_long=trim"):
        clean(long, RATE, Hygiene())
    out, report = clean(long, RATE, Hygiene(too_long="trim"))
    kept = len(out) / RATE
    assert 26.6 <= kept <= 27.2 + 0.05, kept  # cut in the last pause before 30 s, trailing silence trimmed
    assert report["cut_at"] == pytest.approx(kept + report["trimmed_start"], abs=0.3)
    no_pause = speech(35.0, seed=5)
    with pytest.raises(PromptRejected, match="no pause"):
        clean(no_pause, RATE, Hygiene(too_long="trim"))


def test_too_short_after_trimming_is_refused():
    with pytest.raises(PromptRejected, match="too short"):
        clean(np.concatenate([silence(2.0), speech(0.2), silence(2.0)]), RATE, Hygiene())
