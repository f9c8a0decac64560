"""VoiceStore on disk: readable by other users, damaged files reported, ids validated."""
from __future__ import annotations

import stat

import pytest
import torch

from cosy.deploy.voices import VoiceError, VoiceStore
from cosy.prompt.encoder import PromptFeatures

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")


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


def test_a_voice_serves_only_its_own_model_family(tmp_path):
    """Features are the saving model's (speech tokenizer, flow): a CosyVoice2 voice on a CosyVoice3 model is a
    clear error; voices written before the family was recorded count as CosyVoice2's."""
    store = VoiceStore(tmp_path)
    store.save("v3", "你好。", features(), family="cosyvoice3")
    assert store.load("v3", family="cosyvoice3").family == "cosyvoice3"
    with pytest.raises(VoiceError, match="voice 'v3' was saved with a cosyvoice3 model and this model is "
                                         "cosyvoice2: .* save the voice again with this model"):
        store.load("v3", family="cosyvoice2")
    from safetensors.torch import save_file  # a voice as stores before the family field wrote it
    old = tmp_path / "old"
    old.mkdir()
    f = features()
    save_file({"speech_tokens": f.speech_tokens, "mel": f.mel, "embedding": f.embedding},
              str(old / "features.safetensors"), metadata={"voice_id": "old", "prompt_text": "x", "created_at": "1"})
    (old / "voice.json").write_text('{"voice_id": "old", "prompt_text": "x", "created_at": 1}')
    assert store.load("old", family="cosyvoice2").family == "cosyvoice2"
    with pytest.raises(VoiceError, match="saved with a cosyvoice2 model and this model is cosyvoice3"):
        store.load("old", family="cosyvoice3")
    assert {v["voice_id"]: v["family"] for v in store.list()} == {"v3": "cosyvoice3", "old": "cosyvoice2"}
