"""Reading a voice prompt: any common audio file, bytes or array -> mono float32, checked for use as a prompt.

Decoding is soundfile's (libsndfile 1.2, bundled in its wheel): wav, flac, ogg/vorbis/opus and mp3. Integer
PCM comes back scaled to [-1, 1) (int16 / 32768), as the official `torchaudio.load` gives it. Channels are
averaged, like the official `load_wav`.

Prompt limits, each rejected with an `AudioError` that tells a user what is wrong:
* sample rate >= 16 kHz: the speech tokenizer and CAM++ work at 16 kHz, and the official code refuses to
  upsample a prompt to 16 kHz (upsampling cannot add the 4-8 kHz band the models expect);
* at most 30 s: `speech_tokenizer_v2.onnx` is a Whisper-style encoder over at most 30 s (3000 frames), and
  the official frontend asserts this limit;
* at least 0.5 s: 12 speech tokens and 50 fbank frames; below that the speaker embedding is noise and the
  LM has almost no voice to continue (the official prompts are 3-15 s);
* not silent: peak at or above -60 dBFS (a silent prompt gives a meaningless voice);
* finite samples, none louder than MAX_SAMPLE_PEAK (2.0, i.e. +6 dBFS) after decoding: integer PCM is
  always within [-1, 1); a float wav beyond that is broken or not speech (`check_samples`, which the
  HTTP upload applies too, so every surface refuses the same audio).
"""
from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Union

import numpy as np
import soundfile as sf
import torch

from cosy.audio.resample import resample
from cosy.errors import BadRequest

MAX_PROMPT_SECONDS = 30.0
MIN_PROMPT_SECONDS = 0.5
MIN_PROMPT_SAMPLE_RATE = 16000
SILENCE_PEAK = 1e-3  # -60 dBFS
MAX_SAMPLE_PEAK = 2.0  # +6 dBFS: float audio beyond it is refused

AudioSource = Union[str, Path, bytes, bytearray, memoryview, tuple]


class AudioError(BadRequest):
    """The audio cannot be used: unreadable, not audio, too short/long, silent or at too low a rate."""


def _describe(source: object) -> str:
    if isinstance(source, (str, Path)):
        return f"prompt audio file '{source}'"
    return "prompt audio"


def _from_array(data: object, sr: object) -> tuple[np.ndarray, int]:
    """(samples,) or (samples, channels) array of any numeric dtype -> float32 (samples, channels), rate."""
    if isinstance(data, (int, np.integer)) and isinstance(sr, (np.ndarray, torch.Tensor)):
        data, sr = sr, data  # Gradio's numpy audio is (sample_rate, data)
    if isinstance(data, torch.Tensor):
        data = data.detach().cpu().numpy()
    if not isinstance(data, np.ndarray) or not isinstance(sr, (int, np.integer)):
        raise AudioError("prompt audio as a tuple must be (numpy array, sample rate as int)")
    if data.ndim == 1:
        data = data[:, None]
    elif data.ndim == 2:
        if data.shape[0] < data.shape[1]:  # (channels, samples), torch style: fewer channels than samples
            data = data.T
    else:
        raise AudioError(f"prompt audio array must be 1-D or 2-D, got shape {tuple(data.shape)}")
    if np.issubdtype(data.dtype, np.floating):
        out = data.astype(np.float32)
    elif data.dtype == np.uint8:  # 8-bit PCM is unsigned around 128
        out = (data.astype(np.float32) - 128.0) / 128.0
    elif np.issubdtype(data.dtype, np.signedinteger):
        out = data.astype(np.float32) / float(2 ** (8 * data.dtype.itemsize - 1))
    else:
        raise AudioError(f"prompt audio array has unsupported dtype {data.dtype}")
    return out, int(sr)


def _read(source: AudioSource, max_seconds: float | None) -> tuple[np.ndarray, int]:
    """Decode a file path or in-memory file -> float32 (samples, channels), rate."""
    name = _describe(source)
    if isinstance(source, (str, Path)):
        path = Path(source).expanduser()
        if not path.is_file():
            raise AudioError(f"{name} does not exist or is not a file")
        if path.stat().st_size == 0:
            raise AudioError(f"{name} is empty")
        handle: object = str(path)
    else:
        data = bytes(source)
        if not data:
            raise AudioError("prompt audio is empty (0 bytes)")
        handle = io.BytesIO(data)
    try:
        with sf.SoundFile(handle) as f:
            sr, frames = f.samplerate, f.frames
            # Refuse a long file from its header before decoding it all (an hour of audio is GBs).
            if max_seconds is not None and sr > 0 and 0 < frames < 2**62 and frames / sr > max_seconds + 1:
                raise AudioError(f"{name} is {frames / sr:.1f} s; the limit is {max_seconds:g} s")
            wav = f.read(dtype="float32", always_2d=True)
    except AudioError:
        raise
    except Exception as e:  # libsndfile: "Format not recognised", truncated headers, ...
        reason = str(getattr(e, "error_string", "") or e).rstrip(".")
        if "does not exist" in reason:  # what libsndfile says when its mp3 decoder finds no frame
            reason = "unrecognised or corrupt data"
        raise AudioError(f"{name} is not an audio file that can be read (wav, flac, ogg, mp3): {reason}") from None
    return wav, int(sr)


def load_audio(source: AudioSource, max_seconds: float | None = None) -> tuple[torch.Tensor, int]:
    """Decode `source` to mono float32 (N,) at its own sample rate; returns (wav, rate).

    source: a file path (wav/mp3/flac/ogg), the bytes of such a file, or (array, rate) with an array of
    shape (N,) or (N, channels) (float in [-1, 1], or integer PCM). Channels are averaged.
    max_seconds: refuse longer audio from the file header, before decoding it.
    """
    if isinstance(source, tuple):
        if len(source) != 2:
            raise AudioError("prompt audio as a tuple must be (numpy array, sample rate)")
        wav, sr = _from_array(*source)
    elif isinstance(source, (str, Path, bytes, bytearray, memoryview)):
        wav, sr = _read(source, max_seconds)
    else:
        raise AudioError(f"prompt audio must be a path, bytes or (array, rate), not {type(source).__name__}")
    if sr <= 0:
        raise AudioError(f"{_describe(source)} has an invalid sample rate {sr} Hz")
    if wav.shape[0] == 0:
        raise AudioError(f"{_describe(source)} holds no samples")
    mono = wav.mean(axis=1, dtype=np.float32) if wav.shape[1] > 1 else wav[:, 0]
    return torch.from_numpy(np.ascontiguousarray(mono, dtype=np.float32)), sr


def check_prompt(wav: torch.Tensor, sr: int, name: str = "prompt audio") -> None:
    """Raise AudioError unless mono `wav` (N,) at `sr` is usable as a voice prompt (see module doc)."""
    if sr < MIN_PROMPT_SAMPLE_RATE:
        raise AudioError(f"{name}: sample rate {sr} Hz is below {MIN_PROMPT_SAMPLE_RATE} Hz; "
                         f"record or export it at 16 kHz or more")
    seconds = wav.shape[-1] / sr
    if seconds > MAX_PROMPT_SECONDS:
        raise AudioError(f"{name} is {seconds:.1f} s; the limit is {MAX_PROMPT_SECONDS:g} s")
    if seconds < MIN_PROMPT_SECONDS:
        raise AudioError(f"{name} is {seconds:.2f} s; a prompt needs at least {MIN_PROMPT_SECONDS:g} s")
    check_samples(wav, name)
    peak = float(wav.abs().max())
    if peak < SILENCE_PEAK:
        level = "-inf" if peak == 0 else f"{20 * math.log10(peak):.0f}"
        raise AudioError(f"{name} is silent (peak {level} dBFS)")


def check_samples(wav: torch.Tensor | np.ndarray, name: str = "prompt audio") -> None:
    """AudioError unless every sample is finite and within +-MAX_SAMPLE_PEAK."""
    data = wav.detach().cpu().numpy() if isinstance(wav, torch.Tensor) else np.asarray(wav)
    if data.size == 0:
        return
    if not bool(np.isfinite(data).all()):
        raise AudioError(f"{name} contains NaN or infinite samples")
    peak = float(np.abs(data).max())
    if peak > MAX_SAMPLE_PEAK:
        raise AudioError(f"{name} is too loud: its peak is {peak:.3g} x full scale, the limit is "
                         f"{MAX_SAMPLE_PEAK:g} (a float wav out of range or not speech)")


def load_prompt(source: AudioSource) -> tuple[torch.Tensor, int]:
    """load_audio + check_prompt: mono float32 (N,) at its native rate, and that rate."""
    wav, sr = load_audio(source, max_seconds=MAX_PROMPT_SECONDS)
    check_prompt(wav, sr, _describe(source))
    return wav, sr


def load_prompt_wav(source: AudioSource, target_sr: int) -> torch.Tensor:
    """A checked prompt resampled to `target_sr`: float32 (1, N), like the official `load_wav`."""
    wav, sr = load_prompt(source)
    return resample(wav, sr, target_sr).unsqueeze(0)
