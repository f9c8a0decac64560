"""Reference audios (the PAI API's `/api/v1/audio/reference_audio`) are saved voices of the shared data dir.

An upload is decoded here (PyAV: wav, mp3, flac, ogg/opus, aac, m4a, webm; `.pcm` is raw s16le mono at the
given rate), its features are computed once in a worker (`FrontendService.save_voice`, through the shared
queue) and stored as the voice named by a new UUID (as the published ids; its stored features serve every mode), with
`reference.json` (the upload's file name and size, written atomically) beside it. So a reference audio is
listed, used and deleted like any saved voice, by every frontend on the NAS. Voices saved in the WebUI
appear here too (without file name and size).

Nothing is written to the data dir until the upload has been decoded and its features computed; a failure
after that removes the voice again, so a failed request leaves nothing behind.
"""
from __future__ import annotations

import io
import json
import os
import tempfile
import uuid
from pathlib import Path

import av
import numpy as np

from cosy.audio.io import MAX_PROMPT_SECONDS, check_samples
from cosy.deploy.data_dir import upload_extension, write_atomic
from cosy.deploy.voices import UnknownVoice, VoiceError, check_voice_id
from cosy.errors import BadRequest, CosyError, NotFound, echo, storing
from cosy.frontend.encoding import wav_bytes
from cosy.frontend.service import FrontendService
from cosy.pipeline.request import clean_filename

META_FILE = "reference.json"
PCM_DEFAULT_RATE = 16000


def decode_upload(data: bytes, ext: str, pcm_rate: int = PCM_DEFAULT_RATE,
                  limit: float = MAX_PROMPT_SECONDS) -> tuple[np.ndarray, int]:
    """Uploaded bytes -> mono float32 and its rate; BadRequest if they are not audio or are far too long.

    The container is probed from the content, not the name. Decoding stops past `limit` s (+1): a small
    compressed file can hold hours, and a prompt may not exceed 30 s anyway (a longer `limit`: for a prompt
    that enrollment will cut, `cosy.prompt.hygiene`)."""
    if ext == "pcm":
        if len(data) % 2:
            raise BadRequest("a .pcm upload must be 16-bit little-endian mono samples (an even number of bytes)")
        audio = np.frombuffer(data, "<i2").astype(np.float32) / 32768.0
        if pcm_rate <= 0:
            raise BadRequest(f"sample_rate {pcm_rate} is not a sample rate (Hz)")
        if len(audio) > (limit + 1) * pcm_rate:
            raise BadRequest(f"the reference audio is longer than {limit:.0f} s")
        return audio, pcm_rate
    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            stream = next((s for s in container.streams if s.type == "audio"), None)
            if stream is None:
                raise BadRequest("the uploaded file has no audio stream")
            to_float = av.AudioResampler(format="fltp")  # planar float, channels and rate kept
            parts, n, rate = [], 0, stream.rate or 0
            for frame in container.decode(stream):
                for f in to_float.resample(frame):
                    if n and f.sample_rate != rate:  # (ADTS and MPEG frames each say their own rate)
                        raise BadRequest(f"the uploaded audio changes its sample rate ({rate} Hz, then "
                                         f"{f.sample_rate} Hz): export it at one rate")
                    parts.append(f.to_ndarray().mean(axis=0))  # average the channels, as the official load_wav
                    n, rate = n + f.samples, f.sample_rate
                if rate and n > (limit + 1) * rate:
                    raise BadRequest(f"the reference audio is longer than {limit:.0f} s")
    except av.FFmpegError as e:
        raise BadRequest(f"the uploaded file is not audio we can decode ({e})") from None
    if not n:
        raise BadRequest("the uploaded file contains no audio samples")
    audio = np.concatenate(parts).astype(np.float32)
    check_samples(audio, "the reference audio")  # NaN, Inf, far beyond full scale: as every surface refuses
    return audio, int(rate)


class ReferenceAudios:
    """The reference-audio registry of one frontend (every method may block: call from a thread)."""

    def __init__(self, service: FrontendService):
        self.service = service

    @property
    def max_bytes(self) -> int:
        return self.service.data.max_upload_bytes

    def _dir(self, ref_id: str) -> Path:
        try:
            return self.service.data.voices.root / check_voice_id(ref_id)
        except VoiceError:
            raise BadRequest(f"invalid reference audio id {echo(ref_id)}: ids are 1-64 letters, digits, '_', '-' "
                             "or '.', starting with a letter or digit") from None

    def _object(self, voice: dict) -> dict:
        """A voice's voice.json (+ reference.json) -> the PAI reference audio object."""
        meta: object = {}
        try:
            meta = json.loads((self.service.data.voices.root / voice["voice_id"] / META_FILE).read_text("utf-8"))
        except (OSError, ValueError, RecursionError):
            pass  # a voice saved elsewhere (WebUI, CLI): no upload metadata
        if not isinstance(meta, dict):  # damaged: the voice is still served, without its upload's name and size
            meta = {}
        filename, size = meta.get("filename"), meta.get("bytes")
        return {"id": voice["voice_id"], "filename": filename if isinstance(filename, str) else None,
                "bytes": size if isinstance(size, int) and not isinstance(size, bool) else None,
                "created_at": int(voice["created_at"]), "text": voice["prompt_text"]}

    def get(self, ref_id: str) -> dict:
        self._dir(ref_id)
        try:
            voice = self.service.data.voices.listing(ref_id)
        except UnknownVoice:
            raise NotFound(f"unknown reference audio (voice) id {echo(ref_id)}: GET /api/v1/audio/reference_audio "
                           "lists them") from None
        return self._object(voice)

    def list(self, limit: int = 100, order: str = "desc") -> list[dict]:
        voices = sorted(self.service.list_voices(), key=lambda v: v["created_at"], reverse=order == "desc")
        return [self._object(v) for v in voices[:limit]]

    def delete(self, ref_id: str) -> None:
        self._dir(ref_id)
        try:
            self.service.delete_voice(ref_id)
        except UnknownVoice:
            raise NotFound(f"unknown reference audio id {echo(ref_id)}") from None

    def create(self, data: bytes, filename: str, text: str, pcm_rate: int = PCM_DEFAULT_RATE) -> dict:
        """Decode, compute features (queued like a synthesis), store; the new reference audio object."""
        text = (text or "").strip()
        if not text:
            raise BadRequest("'text' is required: the transcript of the reference audio")
        self.service.data.check_upload(len(data))
        self.service.check_transcript(text, "'text'")  # before any work: a transcript the LM cannot take is a 400 now
        filename = clean_filename(filename)
        ext = upload_extension(filename)
        audio, rate = decode_upload(data, ext, pcm_rate)
        wav = wav_bytes(audio, rate)
        ref_id = str(uuid.uuid4())
        fd, tmp = tempfile.mkstemp(suffix=".wav")  # outside the data dir: nothing there until it is a voice
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(wav)
            try:
                saved = self.service.save_voice(ref_id, text, tmp)
            except CosyError as e:  # speak of the upload, not of our temporary file
                raise CosyError(str(e).replace(f"prompt audio file '{tmp}'", "the reference audio"), e.status,
                                e.retry_after) from None
            name = filename
            try:
                meta = {"filename": name, "bytes": len(data)}
                with storing("the reference audio"):
                    write_atomic(self._dir(ref_id) / META_FILE, json.dumps(meta, ensure_ascii=False).encode("utf-8"))
            except BaseException:
                self.service.delete_voice(ref_id)  # no half reference audio
                raise
        finally:
            Path(tmp).unlink(missing_ok=True)
        return {"id": ref_id, "filename": name, "bytes": len(data), "created_at": int(saved["created_at"]),
                "text": saved["prompt_text"]}
