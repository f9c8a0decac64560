"""What every frontend surface (WebUI, gradio_client API, HTTP APIs) asks of this instance.

One `FrontendService` per process: the worker pool (synthesis) and the shared data dir (uploads, saved
voices). Methods take plain values (paths, ids, numbers) and raise `ServiceError` with a message fit to
show a user and an HTTP status; they never leak a stack trace.
"""
from __future__ import annotations

import io
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from cosy.service.workers import JobError, QueueFull, WorkerPool
from cosy.deploy.voices import VoiceError

MODES = ("zero_shot", "cross_lingual", "instruct", "voice")


class ServiceError(Exception):
    """A request that failed; `status` is the HTTP status it maps to, `retry_after` seconds (or None)."""

    def __init__(self, message: str, status: int = 400, retry_after: float | None = None):
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


@dataclass
class SynthesisResult:
    audio: np.ndarray  # (N,) float32
    sample_rate: int
    seconds: float  # wall time


def wav_bytes(audio: np.ndarray, sample_rate: int) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, sample_rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


class FrontendService:
    def __init__(self, pool: WorkerPool, data_dir):
        self.pool, self.data = pool, data_dir  # data_dir: cosy.deploy.data_dir.DataDir

    @property
    def sample_rate(self) -> int:
        return self.pool.sample_rate

    def _voice(self, voice_id: str):
        try:
            return self.data.voices.load(voice_id)
        except VoiceError as e:
            raise ServiceError(str(e), 404 if "unknown voice" in str(e) else 400) from None

    def stream(self, mode: str, text: str, prompt_text: str = "", prompt_wav: str | Path | None = None,
               instruct_text: str = "", voice_id: str | None = None, seed: int | None = None,
               speed: float = 1.0, stream: bool = True) -> Iterator[np.ndarray]:
        """Audio chunks (float32, `sample_rate`) as the workers make them."""
        if mode not in MODES:
            raise ServiceError(f"unknown mode '{mode}' (choose from {', '.join(MODES)})")
        request = dict(mode=mode, text=text or "", prompt_text=prompt_text or "", instruct_text=instruct_text or "",
                       prompt_wav=str(prompt_wav) if prompt_wav else None, seed=seed, speed=float(speed),
                       stream=stream)
        if mode == "voice" and not voice_id:
            raise ServiceError("choose a saved voice (voice_id)")
        if voice_id:  # stored features replace the prompt audio in every mode (no ONNX work per request)
            voice = self._voice(voice_id)
            request.update(voice=voice.features, prompt_wav=None)
            if mode == "voice":
                request["prompt_text"] = voice.prompt_text
        try:
            yield from self.pool.synthesize(**request)
        except QueueFull as e:
            raise ServiceError(str(e), 429, e.retry_after) from None
        except JobError as e:
            raise ServiceError(str(e), 400 if e.user_error else 503) from None

    def synthesize(self, **kw) -> SynthesisResult:
        """The whole utterance at once (non-streaming synthesis)."""
        start = time.monotonic()
        chunks = list(self.stream(**{**kw, "stream": False}))
        audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
        return SynthesisResult(audio, self.sample_rate, time.monotonic() - start)

    def save_voice(self, voice_id: str, prompt_text: str, prompt_wav: str | Path | None,
                   overwrite: bool = False) -> dict:
        """Compute a prompt's features once (in a worker) and store them as a saved voice."""
        if not prompt_wav:
            raise ServiceError("a saved voice needs a prompt audio")
        if not (prompt_text or "").strip():
            raise ServiceError("a saved voice needs the prompt's transcript (prompt_text)")
        try:
            from cosy.deploy.voices import check_voice_id
            check_voice_id(voice_id)
            features = self.pool.prompt_features(str(prompt_wav))
            v = self.data.voices.save(voice_id, prompt_text.strip(), features, overwrite=overwrite)
        except VoiceError as e:
            raise ServiceError(str(e), 409 if "exists" in str(e) else 400) from None
        except QueueFull as e:
            raise ServiceError(str(e), 429, e.retry_after) from None
        except JobError as e:
            raise ServiceError(str(e), 400 if e.user_error else 503) from None
        return {"voice_id": v.voice_id, "prompt_text": v.prompt_text, "created_at": v.created_at}

    def list_voices(self) -> list[dict]:
        return self.data.voices.list()

    def delete_voice(self, voice_id: str) -> None:
        try:
            self.data.voices.delete(voice_id)
        except VoiceError as e:
            raise ServiceError(str(e), 404 if "unknown voice" in str(e) else 400) from None
