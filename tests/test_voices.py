"""VoiceStore on disk: readable by other users, damaged files reported, ids validated."""
from __future__ import annotations

import json
import stat
import time

import pytest
import torch

from cosy.deploy.voices import (
    UnknownVoice,
    VoiceError,
    VoiceExists,
    VoiceLimits,
    VoiceStore,
    VoiceStoreFull,
    WrongFamily,
)
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


@pytest.mark.parametrize("tensor, value, reason", [
    ("mel", torch.randn(1, 20, 40), r"mel must be \(1, 20, 80\)"),
    ("mel", torch.randn(1, 18, 80), r"mel must be \(1, 20, 80\) .* for 10 speech tokens, not \(1, 18, 80\)"),
    ("mel", torch.full((1, 20, 80), float("nan")), "mel must be .* finite"),
    ("speech_tokens", torch.randn(1, 10), r"speech_tokens must be .* not \(1, 10\) torch.float32"),
    ("speech_tokens", torch.full((1, 10), -3, dtype=torch.int32), "speech_tokens must be ids >= 0, not -3"),
    ("embedding", torch.randn(1, 80), r"embedding must be \(1, 192\)"),
])
def test_a_voice_file_of_the_wrong_shapes_is_named_damaged_with_the_reason(tmp_path, tensor, value, reason):
    """Valid safetensors whose tensors are not a voice's (a file damaged on disk, or written by something else):
    a 400 naming the tensor, not a crash in the flow of a worker."""
    from safetensors import safe_open
    from safetensors.torch import save_file
    store = VoiceStore(tmp_path)
    store.save("v3", "x", features())
    path = tmp_path / "v3" / "features.safetensors"
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    save_file({**tensors, tensor: value}, str(path), metadata=meta)
    with pytest.raises(VoiceError, match=f"saved voice 'v3' is damaged \\(ValueError: {reason}"):
        store.load("v3")


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


# --- a managed resource (issue 58): metadata, caps, rename and update, the family as a 409 ------------------


def test_a_voice_keeps_who_made_it_when_and_for_which_model(tmp_path):
    store = VoiceStore(tmp_path)
    v = store.save("m1", "你好。", features(), family="cosyvoice3",
                   meta={"created_by": "api_key", "consent": "consent-0001", "prompt_seconds": 0.4})
    listed = VoiceStore(tmp_path).listing("m1")
    assert listed["created_by"] == "api_key" and listed["consent"] == "consent-0001"
    assert listed["prompt_seconds"] == 0.4 and listed["family"] == "cosyvoice3"
    assert listed["created_at"] == listed["updated_at"] == v.created_at
    assert "key" not in json.dumps(listed).replace("api_key", "")  # a label, never a key


def test_rename_and_update_keep_the_features_and_metadata(tmp_path):
    store = VoiceStore(tmp_path)
    f = features()
    first = store.save("old-name", "你好。", f, meta={"consent": "c1", "created_by": "anonymous"})
    (tmp_path / "old-name" / "reference.json").write_text('{"filename": "a.wav", "bytes": 3}')
    time.sleep(0.01)
    store.update("old-name", new_id="new-name")
    with pytest.raises(UnknownVoice):
        store.load("old-name")
    renamed = store.listing("new-name")
    assert renamed["consent"] == "c1" and renamed["created_at"] == first.created_at
    assert renamed["updated_at"] > first.created_at
    assert (tmp_path / "new-name" / "reference.json").is_file()  # a PAI reference audio's upload record moves too
    assert torch.equal(store.load("new-name").features.mel, f.mel)
    store.update("new-name", prompt_text="新的文本。")
    assert store.load("new-name").prompt_text == store.listing("new-name")["prompt_text"] == "新的文本。"
    g = features()
    store.update("new-name", features=g, prompt_text="再来。", meta={"prompt_seconds": 0.4})
    assert torch.equal(store.load("new-name").features.embedding, g.embedding)
    store.save("other", "x", features())
    with pytest.raises(VoiceExists):
        store.update("new-name", new_id="other")
    with pytest.raises(UnknownVoice):
        store.update("nope", new_id="x1")
    assert sorted(v["voice_id"] for v in store.list()) == ["new-name", "other"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".") and p.name != ".lock"]


def test_the_caps_on_count_and_size_refuse_a_new_voice_with_409(tmp_path):
    store = VoiceStore(tmp_path, limits=VoiceLimits(max_voices=2))
    store.save("a", "x", features())
    store.save("b", "x", features())
    with pytest.raises(VoiceStoreFull, match="2 voices, the limit .*--max_voices") as e:
        store.save("c", "x", features())
    assert e.value.status == 409
    store.save("b", "y", features(), overwrite=True)  # replacing one is not one more
    store.delete("a")
    store.save("c", "x", features())
    size = sum(p.stat().st_size for p in tmp_path.rglob("*") if p.is_file() and not p.name.startswith("."))
    store.limits = VoiceLimits(max_bytes=size + 1000)
    with pytest.raises(VoiceStoreFull, match="--voices_max_mb"):
        store.save("d", "x", features())
    assert sorted(v["voice_id"] for v in store.list()) == ["b", "c"]


def test_a_voice_of_another_family_is_a_409(tmp_path):
    store = VoiceStore(tmp_path)
    store.save("fam", "x", features(), family="cosyvoice2")
    with pytest.raises(WrongFamily) as e:
        store.load("fam", family="cosyvoice3")
    assert e.value.status == 409
