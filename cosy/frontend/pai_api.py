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

from cosy.errors import BadRequest, CosyError
from cosy.frontend.api_routing import add_route, api_router, error_body, sse
from cosy.frontend.encoding import FORMATS
from cosy.frontend.reference_audio import PCM_DEFAULT_RATE, ReferenceAudios
from cosy.frontend.service import FrontendService
from cosy.frontend.speech_stream import Piece, SpeechRequest, open_speech
from cosy.pipeline.request import SEED_RANGE, SPEED_RANGE, SynthesisRequest

# PAI's mode names -> ours; fast_replication uses the reference audio's stored transcript (our mode 'voice')
MODES = {"fast_replication": "voice", "cross_lingual_replication": "cross_lingual",
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
    speed: float = Field(1.0, ge=SPEED_RANGE[0], le=SPEED_RANGE[1])
    output_format: Literal[FORMATS] = "wav"  # PAI documents wav, mp3, pcm; the others work too
    stream: bool = True
    debug: bool = False
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])


def _answer(request_id: str, data: bytes, last: bool, metrics: dict | None) -> dict:
    out = {"output": {"finish_reason": "stop" if last else None,
                      "audio": {"data": base64.b64encode(data).decode("ascii")}}, "request_id": request_id}
    if metrics is not None:
        out["metrics"] = metrics
    return out


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
            yield sse(_answer(request_id, p.data, p.last, m))
            seconds = wait = 0.0
    except CosyError as e:  # after audio went out: the stream ends with an error event
        yield sse({**error_body(str(e), e.status), "request_id": request_id})


def build_pai_router(service: FrontendService, refs: ReferenceAudios, dependencies: list) -> APIRouter:
    router = api_router(dependencies=dependencies, tags=["PAI-compatible"])

    async def create_reference_audio(request: Request):
        """Upload a reference audio (multipart `file` + `text`); its voice features are computed once."""
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > MULTIPART_SLACK:  # refuse a far too large body before reading it
            service.data.check_upload(int(length) - MULTIPART_SLACK)
        form = await request.form(max_files=1, max_fields=10)
        try:
            file, text = form.get("file"), form.get("text")
            if not isinstance(file, UploadFile):
                raise BadRequest("'file' is required: send the reference audio (wav, mp3, flac, opus, aac or pcm) "
                                   "as multipart/form-data")
            if not isinstance(text, str) or not text.strip():
                raise BadRequest("'text' is required: the transcript of the reference audio")
            try:
                rate = int(form.get("sample_rate") or PCM_DEFAULT_RATE)
            except ValueError:
                raise BadRequest("'sample_rate' must be an integer (Hz, for .pcm uploads)") from None
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
            raise BadRequest("input.instruct is required for natural_language_replication "
                             "(e.g. '用四川话说这句话')")
        synthesis = SynthesisRequest(mode=MODES[inp.mode], text=inp.text, voice_id=inp.reference_audio_id,
                                     instruct_text=inp.instruct, speed=body.speed, seed=body.seed, stream=body.stream)
        req = SpeechRequest(synthesis, "pai", fmt=body.output_format, sample_rate=body.sample_rate,
                            bit_rate=body.bit_rate, volume=body.volume)
        pieces = await open_speech(service, refs, req, received)
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
