"""Prompt audio: golden agreement with the official frontend, independent references, formats, bad input."""
from __future__ import annotations

import json
import math
import time
from functools import lru_cache

import librosa
import numpy as np
import pytest
import soundfile as sf
import torch
from conftest import ASSETS, GOLDEN
from safetensors.torch import load_file

from cosy.audio import (
    AudioError,
    flow_mel,
    kaldi_fbank,
    load_audio,
    load_prompt_wav,
    mel_filters,
    resample,
    whisper_log_mel,
)

PROMPTS = ("zero_shot", "cross_lingual")


# ---------------------------------------------------------------- golden (official frontend outputs)

@lru_cache(maxsize=1)
def _golden() -> tuple[dict, dict]:
    cases = json.loads((GOLDEN / "cases.json").read_text(encoding="utf-8"))["cases"]
    return {c["name"]: c for c in cases}, load_file(GOLDEN / "cases.safetensors")


@lru_cache(maxsize=2)
def _ours(prompt: str) -> dict[str, torch.Tensor]:
    path = ASSETS / f"{prompt}_prompt.wav"
    w16, w24 = load_prompt_wav(path, 16000), load_prompt_wav(path, 24000)
    return {"load_wav_16k": w16, "load_wav_24k": w24, "whisper_logmel128": whisper_log_mel(w16),
            "campplus_fbank80": kaldi_fbank(w16).unsqueeze(0), "flow_prompt_mel": flow_mel(w24)}


def _checksums(t: torch.Tensor) -> dict[str, float]:
    t = t.double()
    return {"sum": t.sum().item(), "sum_abs": t.abs().sum().item(), "sum_sq": (t * t).sum().item(),
            "min": t.min().item(), "max": t.max().item()}


@pytest.mark.quick
@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("feature", ["load_wav_16k", "load_wav_24k", "whisper_logmel128", "campplus_fbank80",
                                     "flow_prompt_mel"])
def test_golden_audio_case(prompt, feature):
    cases, tensors = _golden()
    case = cases[f"audio.{prompt}.{feature}"]
    out = next(iter(case["outputs"].values()))
    atol = case["suggested_tolerance"]["atol"]
    ours = _ours(prompt)[feature]
    if "windows" not in out:
        ref = tensors[out["tensor"]]
        assert ours.shape == ref.shape
        assert (ours - ref).abs().max().item() <= atol
        return
    assert list(ours.shape) == out["full_shape"]
    time_axis = 2 if feature == "whisper_logmel128" else 1  # (1, 128, F) vs (1, N) / (1, T, 80)
    for window in out["windows"].values():
        start, stop = window["range"]
        diff = (ours.narrow(time_axis, start, stop - start) - tensors[window["tensor"]]).abs().max().item()
        assert diff <= atol, f"window {window['range']}: {diff}"
    ref, mine = out["checksum_float64"], _checksums(ours)
    # The sum of a mean-normalised tensor is ~0, so it is judged against the tensor's scale (sum_abs).
    assert abs(mine["sum"] - ref["sum"]) <= 1e-5 * ref["sum_abs"]
    for key in ("sum_abs", "sum_sq"):
        assert mine[key] == pytest.approx(ref[key], rel=1e-5)
    for key in ("min", "max"):
        assert abs(mine[key] - ref[key]) <= atol


@pytest.mark.quick
@pytest.mark.parametrize("prompt", PROMPTS)
def test_golden_token_mel_alignment(prompt):
    from cosy.prompt.encoder import align
    cases, _ = _golden()
    out = cases[f"audio.{prompt}.token_mel_alignment"]["outputs"]
    mel, log_mel = _ours(prompt)["flow_prompt_mel"], _ours(prompt)["whisper_logmel128"]
    assert mel.shape[1] == out["raw_mel_len"] and log_mel.shape[2] == out["whisper_frames"]
    placeholder = torch.zeros(1, out["whisper_frames"] // 4, dtype=torch.int32)  # as the golden generator
    tokens, mel = align(placeholder, mel)
    assert tokens.shape[1] == out["aligned_token_len"] and list(mel.shape) == out["aligned_mel_shape"]


# ---------------------------------------------------------------- independent references

def _test_signal(sr: int, seconds: float = 1.0, seed: int = 0) -> np.ndarray:
    """A chirp plus a little noise: energy in every band, no exact silence."""
    t = np.arange(int(sr * seconds)) / sr
    rng = np.random.default_rng(seed)
    x = 0.5 * np.sin(2 * np.pi * (100 * t + 3000 * t ** 2)) + 0.05 * rng.standard_normal(t.shape)
    return x.astype(np.float32)


@pytest.mark.quick
@pytest.mark.parametrize("args", [(16000, 400, 128, 0.0, None), (24000, 1920, 80, 0.0, 8000.0)])
def test_mel_filters_match_librosa(args):
    sr, n_fft, n_mels, fmin, fmax = args
    ref = librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels, fmin=fmin, fmax=fmax)
    np.testing.assert_allclose(mel_filters(*args).numpy(), ref, rtol=1e-5, atol=1e-9)


def _stft(x: np.ndarray, n_fft: int, hop: int) -> np.ndarray:
    """The STFT by its formula (float64): frames of n_fft every hop, a periodic Hann window, the real DFT;
    (n_fft // 2 + 1, frames). librosa.stft's, without its numba JIT (12 s of CPU on a cold cache)."""
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    frames = np.stack([x[i * hop: i * hop + n_fft] for i in range(1 + (len(x) - n_fft) // hop)])
    return np.fft.rfft(frames * window, axis=1).T


def test_whisper_log_mel_matches_formula():
    x = _test_signal(16000)
    spec = _stft(np.pad(x.astype(np.float64), 200, mode="reflect"), n_fft=400, hop=160)[:, :-1]  # centered
    mel = librosa.filters.mel(sr=16000, n_fft=400, n_mels=128).astype(np.float64) @ (np.abs(spec) ** 2)
    ref = np.log10(np.maximum(mel, 1e-10))
    ref = (np.maximum(ref, ref.max() - 8.0) + 4.0) / 4.0
    ours = whisper_log_mel(torch.from_numpy(x)[None])
    assert ours.shape == (1, 128, 100)
    np.testing.assert_allclose(ours[0].numpy(), ref, atol=2e-4)


@pytest.mark.quick
def test_flow_mel_matches_formula():
    x = _test_signal(24000)
    padded = np.pad(x.astype(np.float64), (720, 720), mode="reflect")
    spec = _stft(padded, n_fft=1920, hop=480)
    mag = np.sqrt(spec.real ** 2 + spec.imag ** 2 + 1e-9)
    mel = librosa.filters.mel(sr=24000, n_fft=1920, n_mels=80, fmin=0, fmax=8000).astype(np.float64) @ mag
    ref = np.log(np.maximum(mel, 1e-5)).T
    ours = flow_mel(torch.from_numpy(x)[None])
    assert ours.shape == (1, 50, 80)
    np.testing.assert_allclose(ours[0].numpy(), ref, atol=2e-4)


def _kaldi_fbank_reference(x: np.ndarray) -> np.ndarray:
    """Kaldi's compute-fbank-feats formula in float64 (16 kHz, 80 bins, dither 0, snip_edges)."""
    frame_len, shift, n_fft, n_bins = 400, 160, 512, 80
    n_frames = 1 + (len(x) - frame_len) // shift
    frames = np.stack([x[i * shift: i * shift + frame_len] for i in range(n_frames)]).astype(np.float64)
    frames -= frames.mean(axis=1, keepdims=True)  # remove DC
    frames = frames - 0.97 * np.concatenate([frames[:, :1], frames[:, :-1]], axis=1)  # pre-emphasis
    frames *= (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(frame_len) / (frame_len - 1))) ** 0.85  # povey
    power = np.abs(np.fft.rfft(frames, n=n_fft)) ** 2  # (T, 257)

    def mel(f):
        return 1127.0 * np.log(1.0 + f / 700.0)
    edges = np.linspace(mel(20.0), mel(8000.0), n_bins + 2)
    bin_mel = mel(np.arange(n_fft // 2) * 16000 / n_fft)  # Kaldi ignores the Nyquist bin
    banks = np.zeros((n_bins, n_fft // 2 + 1))
    for m in range(n_bins):
        left, centre, right = edges[m], edges[m + 1], edges[m + 2]
        up, down = (bin_mel - left) / (centre - left), (right - bin_mel) / (right - centre)
        banks[m, :n_fft // 2] = np.maximum(0.0, np.minimum(up, down))
    feats = np.log(np.maximum(power @ banks.T, np.finfo(np.float32).eps))
    return feats - feats.mean(axis=0, keepdims=True)


@pytest.mark.quick
def test_kaldi_fbank_matches_formula():
    x = _test_signal(16000)
    ours = kaldi_fbank(torch.from_numpy(x)[None])
    assert ours.shape == (98, 80)
    np.testing.assert_allclose(ours.numpy(), _kaldi_fbank_reference(x), atol=2e-3)


@pytest.mark.quick
@pytest.mark.parametrize("rates", [(22050, 16000), (24000, 16000), (22050, 24000), (16000, 24000), (44100, 16000)])
def test_resample_matches_sinc_formula(rates):
    """y[j] = sum_i x[i] h((i/orig - j/new) * base), Hann-windowed sinc over +-6 zero crossings, in float64."""
    orig, new = rates
    x = _test_signal(orig, seconds=0.1)
    base = min(orig, new) * 0.99
    t = (np.arange(len(x))[None, :] / orig - np.arange(math.ceil(len(x) * new / orig))[:, None] / new) * base
    h = np.where(np.abs(t) < 6, np.cos(np.pi * t / 12) ** 2 * np.sinc(t), 0.0) * base / orig
    ours = resample(torch.from_numpy(x), orig, new)
    assert ours.dtype == torch.float32 and ours.shape[0] == h.shape[0]
    np.testing.assert_allclose(ours.numpy(), h @ x.astype(np.float64), atol=2e-6)


@pytest.mark.quick
def test_resample_keeps_a_band_limited_tone():
    sr, n = 22050, 22050
    x = np.sin(2 * np.pi * 440 * np.arange(n) / sr).astype(np.float32)
    y = resample(torch.from_numpy(x)[None], sr, 16000)[0].numpy()
    ref = np.sin(2 * np.pi * 440 * np.arange(len(y)) / 16000)
    assert len(y) == 16000
    assert np.abs(y - ref)[200:-200].max() < 2e-3  # away from the zero-padded edges
    same = torch.from_numpy(x)
    assert resample(same, sr, sr) is same  # no-op at equal rates, as the official code skips the transform


# ---------------------------------------------------------------- formats and sources

@pytest.fixture(scope="module")
def zero_shot() -> tuple[np.ndarray, int]:
    x, sr = sf.read(ASSETS / "zero_shot_prompt.wav", dtype="float32")
    return x, sr


@pytest.mark.quick
def test_load_float_and_int16_wav():
    wav, sr = load_audio(ASSETS / "zero_shot_prompt.wav")
    assert sr == 24000 and wav.shape == (83520,) and wav.dtype == torch.float32
    wav, sr = load_audio(ASSETS / "cross_lingual_prompt.wav")
    raw, _ = sf.read(ASSETS / "cross_lingual_prompt.wav", dtype="int16")
    assert sr == 22050 and torch.equal(wav, torch.from_numpy(raw.astype(np.float32) / 32768))


@pytest.mark.quick
@pytest.mark.parametrize("fmt,subtype,tol", [("FLAC", "PCM_16", 1e-4), ("OGG", "VORBIS", 0.15), ("MP3", None, 0.15)])
def test_load_compressed_formats(tmp_path, zero_shot, fmt, subtype, tol):
    x, sr = zero_shot
    path = tmp_path / f"prompt.{fmt.lower()}"
    sf.write(path, x, sr, format=fmt, subtype=subtype)
    for source in (path, str(path), path.read_bytes()):
        wav, rate = load_audio(source)
        assert rate == sr and abs(wav.shape[0] - len(x)) <= 2000
        n = min(len(x), wav.shape[0])
        assert np.abs(wav.numpy()[:n] - x[:n]).max() < tol
    assert load_prompt_wav(path, 16000).shape[0] == 1


@pytest.mark.quick
def test_load_arrays(zero_shot):
    x, sr = zero_shot
    pcm = np.round(x * 32767).astype(np.int16)
    for source in ((pcm, sr), (sr, pcm), (x, sr), (torch.from_numpy(x), sr)):
        wav, rate = load_audio(source)
        assert rate == sr and wav.shape == (len(x),) and np.abs(wav.numpy() - x).max() < 1e-4


@pytest.mark.quick
def test_stereo_is_averaged(tmp_path, zero_shot):
    x, sr = zero_shot
    stereo = np.stack([x, -0.5 * x], axis=1)
    sf.write(tmp_path / "stereo.wav", stereo, sr, subtype="FLOAT")
    wav, _ = load_audio(tmp_path / "stereo.wav")
    np.testing.assert_allclose(wav.numpy(), 0.25 * x, atol=1e-7)
    wav, _ = load_audio((stereo.T.copy(), sr))  # (channels, samples) arrays too
    np.testing.assert_allclose(wav.numpy(), 0.25 * x, atol=1e-7)


# ---------------------------------------------------------------- bad input: a clear AudioError, fast

def _tone(sr: int, seconds: float, amp: float = 0.3) -> np.ndarray:
    return (amp * np.sin(2 * np.pi * 220 * np.arange(int(sr * seconds)) / sr)).astype(np.float32)


def _file(path, data: bytes):
    path.write_bytes(data)
    return path


@pytest.mark.quick
@pytest.mark.parametrize("make,message", [
    (lambda p: sf.write(p / "a.wav", _tone(16000, 0.2), 16000) or p / "a.wav", r"0\.20 s; a prompt needs at least"),
    (lambda p: sf.write(p / "a.wav", _tone(16000, 40), 16000) or p / "a.wav", r"40\.0 s; the limit is 30 s"),
    (lambda p: sf.write(p / "a.wav", _tone(8000, 3), 8000) or p / "a.wav", r"sample rate 8000 Hz is below 16000 Hz"),
    (lambda p: sf.write(p / "a.wav", np.zeros(48000, np.float32), 16000) or p / "a.wav", r"is silent"),
    (lambda p: sf.write(p / "a.wav", _tone(16000, 3, 1e-4), 16000) or p / "a.wav", r"is silent \(peak -7\d dBFS\)"),
    (lambda p: _file(p / "a.wav", b"RIFF\x24\x00\x00\x00WAVEfmt garbage" * 3), r"is not an audio file"),
    (lambda p: _file(p / "a.mp3", b"just some text, not audio\n" * 20), r"is not an audio file"),
    (lambda p: _file(p / "a.wav", b""), r"is empty"),
    (lambda p: p / "missing.wav", r"does not exist"),
    (lambda p: b"", r"empty \(0 bytes\)"),
    (lambda p: b"\x00\x01\x02" * 500, r"is not an audio file"),
    (lambda p: (np.full(32000, np.nan, np.float32), 16000), r"NaN"),
    (lambda p: (_tone(16000, 40), 16000), r"40\.0 s; the limit is 30 s"),
    (lambda p: 12345, r"must be a path, bytes or \(array, rate\)"),
])
def test_bad_prompt_audio(tmp_path, make, message):
    source = make(tmp_path)
    start = time.perf_counter()
    with pytest.raises(AudioError, match=message):
        load_prompt_wav(source, 16000)
    assert time.perf_counter() - start < 5


@pytest.mark.quick
def test_truncated_wav_is_rejected_as_too_short(tmp_path):
    (tmp_path / "cut.wav").write_bytes((ASSETS / "zero_shot_prompt.wav").read_bytes()[:4000])
    with pytest.raises(AudioError, match="a prompt needs at least"):
        load_prompt_wav(tmp_path / "cut.wav", 16000)
