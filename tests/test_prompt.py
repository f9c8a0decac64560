"""VoicePromptEncoder over the random ONNX stand-ins: shapes, alignment, token range, thread safety, errors."""
from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
import pytest
import soundfile as sf
import torch
from conftest import ASSETS

from cosy.audio import AudioError, load_prompt_wav, whisper_log_mel
from cosy.model.families.cosyvoice2 import FAMILY as CV2
from cosy.model.files import ModelDirError
from cosy.prompt import PromptFeatures, VoicePromptEncoder, align
from cosy.verify.random_model.onnx_models import write_campplus_onnx, write_speech_tokenizer_onnx

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")

PROMPTS = {"zero_shot": (87, 348), "cross_lingual": (343, 1374)}  # aligned tokens, Whisper frames


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("onnx")
    write_speech_tokenizer_onnx(d / "speech_tokenizer_v2.onnx", seed=0)
    write_campplus_onnx(d / "campplus.onnx", seed=0)
    return d


@pytest.fixture(scope="module")
def encoder(onnx_dir) -> VoicePromptEncoder:
    return VoicePromptEncoder(onnx_dir, threads=1, family=CV2)


@pytest.fixture(scope="module")
def encoded(encoder) -> dict[str, PromptFeatures]:
    return {name: encoder.encode(ASSETS / f"{name}_prompt.wav") for name in PROMPTS}


def test_stand_ins_have_the_official_signatures(onnx_dir):
    tok = ort.InferenceSession(str(onnx_dir / "speech_tokenizer_v2.onnx"), providers=["CPUExecutionProvider"])
    assert [(i.name, i.type, i.shape[1:2]) for i in tok.get_inputs()] == [
        ("feats", "tensor(float)", [128]), ("feats_length", "tensor(int32)", [])]
    assert [(o.name, o.type, len(o.shape)) for o in tok.get_outputs()] == [("indices", "tensor(int32)", 2)]
    cam = ort.InferenceSession(str(onnx_dir / "campplus.onnx"), providers=["CPUExecutionProvider"])
    assert [(i.name, i.type, i.shape[2]) for i in cam.get_inputs()] == [("input", "tensor(float)", 80)]
    assert [(o.name, o.type, o.shape[1]) for o in cam.get_outputs()] == [("output", "tensor(float)", 192)]
    for f in ("speech_tokenizer_v2.onnx", "campplus.onnx"):
        assert (onnx_dir / f).stat().st_size < 10 * 2**20


def test_stand_ins_are_seeded(tmp_path):
    for writer in (write_speech_tokenizer_onnx, write_campplus_onnx):
        a, b, c = (writer(tmp_path / f"{i}.onnx", seed=s).read_bytes() for i, s in enumerate((3, 3, 4)))
        assert a == b and a != c


@pytest.mark.parametrize("name", PROMPTS)
def test_encode_shapes_and_alignment(encoded, name):
    f = encoded[name]
    n_tokens, frames = PROMPTS[name]
    assert f.speech_tokens.dtype == torch.int32 and f.speech_tokens.shape == (1, n_tokens)
    assert f.mel.dtype == torch.float32 and f.mel.shape == (1, 2 * n_tokens, 80)
    assert f.embedding.dtype == torch.float32 and f.embedding.shape == (1, 192)
    assert 0 <= int(f.speech_tokens.min()) and int(f.speech_tokens.max()) <= 6560
    assert torch.isfinite(f.mel).all() and torch.isfinite(f.embedding).all()
    # about 25 tokens per second of prompt
    seconds = sf.info(str(ASSETS / f"{name}_prompt.wav")).duration
    assert abs(n_tokens / seconds - 25) < 0.5
    # the tokenizer itself gives ceil(F / 4); alignment then cuts to the mel (cross-lingual: 344 -> 343)
    assert frames == whisper_log_mel(load_prompt_wav(ASSETS / f"{name}_prompt.wav", 16000)).shape[2]


def test_tokens_and_embedding_depend_on_the_input(encoded):
    a, b = encoded["zero_shot"], encoded["cross_lingual"]
    assert len(set(a.speech_tokens[0].tolist())) > 5
    assert not torch.equal(a.speech_tokens[:, :50], b.speech_tokens[:, :50])
    assert (a.embedding - b.embedding).abs().max() > 1e-3


@pytest.mark.parametrize("frames", [397, 398, 399, 400, 401])
def test_token_count_is_ceil_of_frames_over_4(encoder, frames):
    rng = np.random.default_rng(frames)
    wav = torch.from_numpy(0.1 * rng.standard_normal(frames * 160).astype(np.float32))[None]
    assert encoder.speech_tokens(wav).shape == (1, math.ceil(frames / 4))


def test_align_rule():
    mel = torch.randn(1, 175, 80)
    tokens, m = align(torch.arange(100, dtype=torch.int32)[None], mel)  # more tokens than mel/2
    assert tokens.shape == (1, 87) and torch.equal(m, mel[:, :174])
    tokens, m = align(torch.arange(80, dtype=torch.int32)[None], mel)  # fewer tokens
    assert tokens.shape == (1, 80) and torch.equal(m, mel[:, :160])


def test_encode_accepts_bytes_and_arrays(encoder, encoded):
    path = ASSETS / "zero_shot_prompt.wav"
    ref = encoded["zero_shot"]
    x, sr = sf.read(path, dtype="float32")
    for source in (path.read_bytes(), (x, sr), str(path)):
        f = encoder.encode(source)
        assert torch.equal(f.speech_tokens, ref.speech_tokens) and torch.equal(f.mel, ref.mel)
        assert torch.equal(f.embedding, ref.embedding)


def test_concurrent_encode_matches_sequential(encoder, encoded):
    names = list(PROMPTS) * 4
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda n: encoder.encode(ASSETS / f"{n}_prompt.wav"), names))
    for name, f in zip(names, results):
        ref = encoded[name]
        assert torch.equal(f.speech_tokens, ref.speech_tokens)
        assert torch.equal(f.mel, ref.mel) and torch.equal(f.embedding, ref.embedding)


def test_bad_audio_is_an_audio_error(encoder):
    with pytest.raises(AudioError, match="silent"):
        encoder.encode((np.zeros(48000, np.float32), 16000))
    with pytest.raises(AudioError, match="the speech tokenizer takes at most 30 s"):
        encoder.speech_tokens(torch.zeros(1, 31 * 16000))


def test_missing_or_corrupt_onnx_files_are_named(tmp_path, onnx_dir):
    (tmp_path / "campplus.onnx").write_bytes((onnx_dir / "campplus.onnx").read_bytes())
    with pytest.raises(ModelDirError, match="speech_tokenizer_v2.onnx is missing"):
        VoicePromptEncoder(tmp_path, family=CV2)
    (tmp_path / "speech_tokenizer_v2.onnx").write_bytes(b"not a protobuf at all" * 10)
    with pytest.raises(ModelDirError, match="speech_tokenizer_v2.onnx is corrupt"):
        VoicePromptEncoder(tmp_path, family=CV2)
    (tmp_path / "speech_tokenizer_v2.onnx").write_bytes((onnx_dir / "campplus.onnx").read_bytes())
    with pytest.raises(ModelDirError, match="does not look like a speech tokenizer"):
        VoicePromptEncoder(tmp_path, family=CV2)
    with pytest.raises(ModelDirError, match="does not exist"):
        VoicePromptEncoder(tmp_path / "nowhere", family=CV2)
