"""Decoding a reference-audio upload (`cosy.frontend.reference_audio.decode_upload`): a file whose sample rate
changes mid-stream (ADTS AAC frames at 44.1, then 22.05, then 16 kHz, concatenated: each frame says its own rate)
was decoded as one signal at the last frame's rate, so the voice was stored slowed down or sped up, with its
30 s limit counted at the wrong rate: it is a 400 saying so."""
from __future__ import annotations

import numpy as np
import pytest

from cosy.errors import BadRequest
from cosy.frontend.encoding import make_encoder
from cosy.frontend.reference_audio import decode_upload

pytestmark = pytest.mark.quick


def aac(rate: int, seconds: float = 1.0) -> bytes:
    enc = make_encoder("aac", rate, streaming=False)
    tone = (0.3 * np.sin(2 * np.pi * 220 * np.arange(int(rate * seconds)) / rate)).astype(np.float32)
    return enc.encode(tone) + enc.finish()


def test_an_upload_whose_rate_changes_is_refused():
    with pytest.raises(BadRequest, match="changes its sample rate.*44100 Hz.*22050 Hz"):
        decode_upload(aac(44100) + aac(22050) + aac(16000), "aac")


def test_an_upload_at_one_rate_is_decoded_at_it():
    audio, rate = decode_upload(aac(22050) + aac(22050), "aac")
    assert rate == 22050 and abs(len(audio) / rate - 2.0) < 0.2
