"""CosyVoice3's streaming vocoder in linear time (`CausalStreamVocoder`) against the official re-vocoding of
the whole mel at every chunk (`RevocodeVocoder`): the same chunks, sample for sample within float rounding,
for the official chunk schedule and for ragged pieces; on a 60 s utterance, the joined stream equals one
final vocoding of the whole mel, and the mel the vocoder holds stays bounded. The HiFT is the golden
directory's (weights written by the official code)."""
from __future__ import annotations

import pytest
import torch
from conftest import FIXTURES

from cosy.model.files import ModelDir
from cosy.model.load import load_hift
from cosy.pipeline.stream_vocoder import CausalStreamVocoder, RevocodeVocoder

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")

FRAMES_PER_SECOND = 50  # CosyVoice3's mel rate (24 kHz, hop 480)
TOL = 1e-5  # float rounding: convolutions over windows of other lengths may sum in another order


@pytest.fixture(scope="module")
def hift():
    return load_hift(ModelDir(FIXTURES / "golden-cv3" / "model"))


def _mel(seconds: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 80, int(seconds * FRAMES_PER_SECOND), generator=g) * 0.8 - 4  # (1, 80, T)


def _stream(vocoder, mel: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    """Push `mel` in pieces of `sizes` frames (cycled), the last one final; the chunks out."""
    out, done, i = [], 0, 0
    while done < mel.shape[2]:
        n = sizes[i % len(sizes)]
        out.append(vocoder.push(mel[:, :, done:done + n], done + n >= mel.shape[2]))
        done, i = done + n, i + 1
    return out


@pytest.mark.parametrize("seconds, sizes", [(2, [50]), (12, [50]), (12, [7, 3, 61, 1, 40]), (4, [200, 1])])
def test_chunks_equal_the_official_revocoding(hift, seconds, sizes):
    mel = _mel(seconds, seed=seconds + len(sizes))
    official = _stream(RevocodeVocoder(hift), mel, sizes)
    ours = _stream(CausalStreamVocoder(hift), mel, sizes)
    assert [c.numel() for c in ours] == [c.numel() for c in official]
    assert sum(c.numel() for c in ours) == mel.shape[2] * hift.cfg.upsample_scale
    for a, b in zip(official, ours):
        assert a.numel() == 0 or (a - b).abs().max() <= TOL


def test_a_60_s_stream_is_the_whole_mel_vocoded_once_and_holds_a_bounded_mel(hift):
    mel = _mel(60, seed=60)
    vocoder = CausalStreamVocoder(hift)
    chunks, held = [], []
    for done in range(0, mel.shape[2], 50):
        chunks.append(vocoder.push(mel[:, :, done:done + 50], done + 50 >= mel.shape[2]))
        held.append(vocoder.mel.shape[2])
    whole, _ = hift.inference(mel, finalize=True)
    joined = torch.cat(chunks)
    assert joined.shape == whole[0].shape and (joined - whole[0]).abs().max() <= TOL
    # what a chunk re-reads: its own frames and the context before them, never the utterance so far
    assert max(held) <= 50 + hift.decode_context_frames + hift.context_frames, held


def test_context_covers_the_vocoders_reach(hift):
    """A change of the mel (or of the source) at one frame changes no sample further right than the context
    that `decode_context_frames` allows: measured by perturbing one frame."""
    mel = _mel(4, seed=1)
    frame = 100
    f0 = hift.predict_f0(mel, finalize=True)
    source = hift.source(f0)
    base = hift.decode(mel, source)
    scale = hift.cfg.upsample_scale
    bumped_mel = mel.clone()
    bumped_mel[:, :, frame] += 1
    bumped_source = source.clone()
    bumped_source[:, :, frame * scale] += 0.5
    for changed in (hift.decode(bumped_mel, source), hift.decode(mel, bumped_source)):
        moved = ((changed - base)[0].abs() > 1e-6).nonzero()
        assert len(moved), "the perturbation changed nothing"
        reach = (moved.max().item() + 1) / scale - frame
        assert reach <= hift.decode_context_frames, (reach, hift.decode_context_frames)
