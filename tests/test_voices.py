"""VoiceStore on disk: readable by other users, damaged files reported, ids validated."""
from __future__ import annotations

import stat

import pytest
import torch

from cosy.deploy.voices import VoiceError, VoiceStore
from cosy.prompt.encoder import PromptFeatures


def features() -> PromptFeatures:
    return PromptFeatures(torch.arange(10, dtype=torch.int32)[None], torch.randn(1, 20, 80), torch.randn(1, 192))


def test_saved_voice_round_trip_and_permissions(tmp_path):
    store = VoiceStore(tmp_path)
    f = features()
    store.save("v1", "你好。", f)
    v = VoiceStore(tmp_path).load("v1")  # another instance (another frontend) sees it
    assert v.prompt_text == "你好。" and torch.equal(v.features.mel, f.mel)
    assert stat.S_IMODE((tmp_path / "v1").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "v1" / "features.safetensors").stat().st_mode) == 0o644
    store.save("v1", "新的。", f, overwrite=True)
    assert store.load("v1").prompt_text == "新的。"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".v1")]  # no temp dirs left


def test_damaged_and_unknown_voices_are_clear_errors(tmp_path):
    store = VoiceStore(tmp_path)
    store.save("v2", "x", features())
    (tmp_path / "v2" / "features.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(VoiceError, match="damaged"):
        store.load("v2")
    with pytest.raises(VoiceError, match="unknown voice 'nope'"):
        store.load("nope")
    store.delete("v2")
    assert store.list() == []
