"""The PAI-EAS CosyVoice2 HTTP API (same paths and fields), served by a frontend.

    POST   /api/v1/audio/reference_audio        multipart: file (wav/mp3/flac/opus/aac/pcm), text
                                                [, sample_rate: of a .pcm upload, default 16000]
                                                -> {id, filename, bytes, created_at, text}
    GET    /api/v1/audio/reference_audio?limit=100&order=desc   -> [reference audio, ...] by created_at
    GET    /api/v1/audio/reference_audio/{id}   -> reference audio
    DELETE /api/v1/audio/reference_audio/{id}   -> {"code": "OK", "message": ..., "data": {}}
    POST   /api/v1/audio/speech                 JSON, see PaiSpeech

Speech answers `{"output": {"finish_reason": "stop", "audio": {"data": "<base64>"}}, "request_id": ...}`;
streamed (the default), one SSE `data: {...}` line of that shape per piece of the encoded file
(finish_reason null until the last one, "stop" on it; the pieces' audio concatenated is one file).
With `debug`, each answer also carries `"metrics": {speech_len, server_cost_time, generate_time}`:
seconds of audio in this piece, seconds since the server received the request, seconds this piece's audio
took (the first: queue wait + synthesis). First-packet time = the first server_cost_time; RTF = the
last server_cost_time / the sum of speech_len. `seed` (an extension) makes a request reproducible.
"""
from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from cosy.frontend.api_routing import add_route, api_router, error_body
from cosy.frontend.encoding import FORMATS
from cosy.frontend.metrics import Metrics
from cosy.frontend.reference_audio import PCM_DEFAULT_RATE, ReferenceAudios
from cosy.frontend.service import FrontendService, ServiceError
from cosy.frontend.speech_stream import Piece, SpeechRequest, open_speech

MODES = {"fast_replication": "zero_shot", "cross_lingual_replication": "cross_lingual",
         "natural_language_replication": "instruct"}
BASE = "/api/v1/audio"
MULTIPART_SLACK = 1 << 20  # form fields and boundaries around the file


class PaiInput(BaseModel):
    model_config = ConfigDict(extra="ignore")
    mode: Literal["fast_replication", "cross_lingual_replication", "natural_language_replication"]
    text: str = Field(min_length=1)
    reference_audio_id: str = Field(min_length=1)
    instruct: str = ""


class PaiSpeech(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = "CosyVoice2-0.5B"  # any name is accepted: a frontend serves one model
    input: PaiInput
    sample_rate: int = Field(24000, ge=8000, le=48000)
    bit_rate: int | None = Field(None, ge=8000, le=320000, description="bit/s, for mp3/aac/opus")
    volume: float = Field(1.0, ge=0.0, le=10.0, description="gain; louder samples are clipped")
    speed: float = Field(1.0, ge=0.5, le=2.0)
    output_format: Literal[FORMATS] = "wav"  # PAI documents wav, mp3, pcm; the others work too
    stream: bool = True
    debug: bool = False
    seed: int | None = Field(None, ge=0, lt=2**31)


def _answer(request_id: str, data: bytes, last: bool, metrics: dict | None) -> dict:
    out = {"output": {"finish_reason": "stop" if last else None,
                      "audio": {"data": base64.b64encode(data).decode("ascii")}}, "request_id": request_id}
    if metrics is not None:
        out["metrics"] = metrics
    return out


def _sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


async def _events(pieces: AsyncIterator[Piece], request_id: str, debug: bool) -> AsyncIterator[str]:
    """SSE lines; pieces without bytes (the codec still filling a frame) are merged into the next one."""
    seconds = wait = 0.0
    try:
        async for p in pieces:
            seconds, wait = seconds + p.seconds, wait + p.generate_time
            if not p.data and not p.last:
                continue
            m = {"speech_len": round(seconds, 4), "server_cost_time": round(p.elapsed, 4),
                 "generate_time": round(wait, 4)} if debug else None
            yield _sse(_answer(request_id, p.data, p.last, m))
            seconds = wait = 0.0
    except ServiceError as e:  # after audio went out: the stream ends with an error event
        yield _sse({**error_body(str(e), e.status), "request_id": request_id})


def build_pai_router(service: FrontendService, refs: ReferenceAudios, metrics: Metrics,
                     dependencies: list) -> APIRouter:
    router = api_router(dependencies=dependencies, tags=["PAI-compatible"])

    async def create_reference_audio(request: Request):
        """Upload a reference audio (multipart `file` + `text`); its voice features are computed once."""
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > refs.max_bytes + MULTIPART_SLACK:
            raise ServiceError(f"the upload is {int(length) / 2**20:.1f} MB; the limit is "
                               f"{refs.max_bytes / 2**20:.0f} MB (a reference needs only 3-30 s of audio)", 413)
        form = await request.form(max_files=1, max_fields=10)
        try:
            file, text = form.get("file"), form.get("text")
            if not isinstance(file, UploadFile):
                raise ServiceError("'file' is required: send the reference audio (wav, mp3, flac, opus, aac or pcm) "
                                   "as multipart/form-data")
            if not isinstance(text, str) or not text.strip():
                raise ServiceError("'text' is required: the transcript of the reference audio")
            try:
                rate = int(form.get("sample_rate") or PCM_DEFAULT_RATE)
            except ValueError:
                raise ServiceError("'sample_rate' must be an integer (Hz, for .pcm uploads)") from None
            data = await file.read(refs.max_bytes + 1)
            return await run_in_threadpool(refs.create, data, file.filename or "", text, rate)
        finally:
            await form.close()

    async def list_reference_audio(limit: int = Query(100, ge=1, le=1000),
                                   order: Literal["asc", "desc"] = "desc"):
        """Reference audios (every saved voice of the data dir), by creation time."""
        return await run_in_threadpool(refs.list, limit, order)

    async def get_reference_audio(reference_audio_id: str):
        return await run_in_threadpool(refs.get, reference_audio_id)

    async def delete_reference_audio(reference_audio_id: str):
        await run_in_threadpool(refs.delete, reference_audio_id)
        return {"code": "OK", "message": f"reference audio {reference_audio_id} deleted", "data": {}}

    async def speech(body: PaiSpeech):
        """Synthesize with a reference audio; SSE when `stream` (default), else one JSON answer."""
        received, request_id = time.monotonic(), uuid.uuid4().hex
        inp = body.input
        if MODES[inp.mode] == "instruct" and not inp.instruct.strip():
            raise ServiceError("input.instruct is required for natural_language_replication "
                               "(e.g. '用四川话说这句话')")
        req = SpeechRequest(mode=MODES[inp.mode], text=inp.text, voice_id=inp.reference_audio_id,
                            instruct=inp.instruct, speed=body.speed, seed=body.seed, fmt=body.output_format,
                            sample_rate=body.sample_rate, bit_rate=body.bit_rate, volume=body.volume,
                            stream=body.stream)
        pieces = await open_speech(service, refs, req, metrics=metrics, api="pai", received=received)
        headers = {"X-Request-Id": request_id}
        if body.stream:
            return StreamingResponse(_events(pieces, request_id, body.debug), media_type="text/event-stream",
                                     headers={**headers, "Cache-Control": "no-cache"})
        data, seconds, wait, elapsed = bytearray(), 0.0, 0.0, 0.0
        async for p in pieces:
            data += p.data
            seconds, wait, elapsed = seconds + p.seconds, wait + p.generate_time, p.elapsed
        m = {"speech_len": round(seconds, 4), "server_cost_time": round(elapsed, 4),
             "generate_time": round(wait, 4)} if body.debug else None
        return JSONResponse(_answer(request_id, bytes(data), True, m), headers=headers)

    ref = f"{BASE}/reference_audio"
    add_route(router, "POST", ref, create_reference_audio, summary="Upload a reference audio")
    add_route(router, "GET", ref, list_reference_audio, summary="List reference audios")
    add_route(router, "GET", ref + "/{reference_audio_id}", get_reference_audio, summary="Get a reference audio")
    add_route(router, "DELETE", ref + "/{reference_audio_id}", delete_reference_audio,
              summary="Delete a reference audio")
    add_route(router, "POST", f"{BASE}/speech", speech, summary="Synthesize speech (PAI)")
    return router
