"""The PAI-EAS CosyVoice2 HTTP API (same paths and fields as published: /work/shared/PAI-API.md), served by a frontend.

    POST   /api/v1/audio/reference_audio        multipart: file (wav/mp3/flac/opus/aac/pcm), text
                                                [, sample_rate: of a .pcm upload, default 16000]
                                                -> {id (a UUID), filename, bytes, created_at, text}
    GET    /api/v1/audio/reference_audio?limit=100&order=desc   -> [reference audio, ...] by created_at
    GET    /api/v1/audio/reference_audio/{id}   -> reference audio
    DELETE /api/v1/audio/reference_audio/{id}   -> {"code": "OK", "message": "reference audio: <id> deleted.",
                                                    "data": {}}
    POST   /api/v1/audio/speech                 {"model", "stream" (default true), "input": {"mode", "text",
                                                 "reference_audio_id", "instruct", "sample_rate" (24000),
                                                 "bit_rate" ("192k"), "volume" (1.0), "speed" (1.0),
                                                 "output_format" (wav), "debug", "seed" and "priority"
                                                 (extensions)}}

`priority` (an extension): interactive, default or bulk; a stream is interactive unless it says otherwise, a
whole file default (a client may ask for a less urgent class, a more urgent one where the frontend's
--allow_priority lets it). The options (sample_rate ... priority) go inside `input`, as published; our
earlier layout with them at the top level is still accepted; one given in both places with different values
is a 400 naming it.
`bit_rate` is "16k" ... "384k" or an integer in bit/s, capped at what the codec can do (encoding.py).

Speech answers `{"output": {"finish_reason": "stop", "audio": {"id", "data": "<base64>"}}, "request_id",
"error": null, "usage": {"characters"}}`; streamed (the default), one SSE `data: {...}` line of that shape
per piece of the encoded file (finish_reason null until the last one, "stop" on it, `usage` on the last
one; the pieces' audio concatenated is one file). A failure after audio went out ends the stream with an
event whose `error` is the error object. With `debug`, each answer also carries `"metrics": {speech_len,
server_cost_time, generate_time}`: seconds of audio in this piece (> 0 in every event), seconds since the
server received the request, seconds this piece's audio took (the first: queue wait + synthesis).
First-packet time = the first server_cost_time; RTF = the last server_cost_time / the sum of speech_len.

Timestamps (opt-in, docs/api/timestamps.md): `input.sentence_timestamp_enabled` (an extension) or
`input.word_timestamp_enabled` (the managed service's name; needs the frontend's --aligner) add
`output.sentences`: streamed, to every event, the sentences that began or ended since the previous one
(`{"type": "sentence-begin" | "sentence-end", "sentence": {...}}`, as the managed service's WebSocket names
them; a begin comes with the event holding the sentence's first audio, an end with the event holding the
sentence's last audio);
whole, the list of every sentence spoken. A sentence is `{index, text, begin_time, end_time (ms in the
output audio; null in a begin), begin_index, end_index (offsets into input.text, end exclusive)}`, with
`words` when word timings were asked. Without them the answers are as published, byte for byte.
"""
from __future__ import annotations

import base64
import time
import uuid
from collections.abc import AsyncIterator
from typing import Literal

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import ConfigDict, Field
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from cosy.errors import BadRequest, CosyError, PayloadTooLarge, echo
from cosy.frontend.api_routing import add_route, api_router, error_body, sse
from cosy.frontend.encoding import FORMATS
from cosy.frontend.reference_audio import PCM_DEFAULT_RATE, ReferenceAudios
from cosy.frontend.service import FrontendService
from cosy.frontend.speech_stream import Piece, SpeechRequest, open_speech, until_disconnected
from cosy.frontend.text_params import TextControls
from cosy.pipeline.request import (
    LIMIT_RANGE,
    PCM_RATE_RANGE,
    PRIORITIES,
    SAMPLE_RATE_RANGE,
    SEED_RANGE,
    SPEED_RANGE,
    VOLUME_RANGE,
    SynthesisRequest,
    check_range,
)
from cosy.pipeline.timing import SentenceMark
from cosy.text.language import check_language
from cosy.text.lexicon import parse_hot_fix

# PAI's mode names -> ours; fast_replication uses the reference audio's stored transcript (our mode 'voice')
MODES = {"fast_replication": "voice", "cross_lingual_replication": "cross_lingual",
         "natural_language_replication": "instruct"}
BASE = "/api/v1/audio"
MULTIPART_SLACK = 1 << 20  # form fields and boundaries around the file


# the published bit rates (strings with a unit); integers in bit/s are accepted too
BIT_RATES = ("16k", "32k", "48k", "64k", "128k", "192k", "256k", "320k", "384k")
BIT_RATE_RANGE = (8000, 384000)
DEFAULT_BIT_RATE = "192k"


def parse_bit_rate(value: object, where: str = "bit_rate") -> int | None:
    """'48k' (one of BIT_RATES) or an integer in bit/s -> bit/s; BadRequest naming `where` otherwise."""
    allowed = (f"use one of {', '.join(BIT_RATES)} (a string, as published) or an integer in bit/s from "
               f"{BIT_RATE_RANGE[0]} to {BIT_RATE_RANGE[1]}")
    if value is None:
        return None
    if isinstance(value, str):
        v = value.strip().lower()
        if v in BIT_RATES:
            return int(v[:-1]) * 1000
        if v.isascii() and v.isdigit() and len(v) <= 9:  # int() refuses '²' and 5,000 digits (a ValueError)
            value = int(v)
        else:
            raise BadRequest(f"{where} {echo(value)} is not a bit rate: {allowed}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not BIT_RATE_RANGE[0] <= value <= BIT_RATE_RANGE[1]:
        raise BadRequest(f"{where} {echo(value)} is not a bit rate: {allowed}")
    return value


class PaiOptions(TextControls):
    """How to synthesize and encode: published inside `input`; our earlier layout had them at the top level.
    None = not given here."""
    model_config = ConfigDict(extra="ignore")
    sample_rate: int | None = Field(None, ge=SAMPLE_RATE_RANGE[0], le=SAMPLE_RATE_RANGE[1], description="Hz")
    bit_rate: str | int | None = Field(None, description="'16k' ... '384k' (default '192k') or bit/s; "
                                       "mp3/aac/opus; capped at what the codec can do at the sample rate")
    volume: float | None = Field(None, ge=VOLUME_RANGE[0], le=VOLUME_RANGE[1],
                                 description="gain (default 1.0); louder samples are clipped")
    speed: float | None = Field(None, ge=SPEED_RANGE[0], le=SPEED_RANGE[1], description="default 1.0")
    # PAI documents wav, mp3, pcm; the others work too
    output_format: Literal[FORMATS] | None = Field(None, description="wav (default), mp3, pcm, flac, opus, aac")
    debug: bool | None = None
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1], description="an extension: reproducible")
    enable_ssml: bool | None = Field(None, description="the text is SSML (README 'SSML'); default false")
    hot_fix: dict | None = Field(
        None, description="per-request pronunciation fixes, the managed service's shape: {\"pronunciation\": "
        "[{\"重庆\": \"chong2 qing4\"}], \"replace\": [{\"WHO\": \"世界卫生组织\"}]}; they take precedence over "
        "the shared lexicon")
    priority: Literal[PRIORITIES] | None = Field(
        None, description="an extension: the request's priority class (default: interactive for a stream, default "
        "for a whole file; a more urgent class than that only where the frontend allows it)")
    sentence_timestamp_enabled: bool | None = Field(
        None, description="an extension: each sentence's begin_time/end_time (ms) and begin_index/end_index (into "
        "input.text) in output.sentences; default false")
    word_timestamp_enabled: bool | None = Field(
        None, description="the managed service's name: sentence timings with each one's words (needs the "
        "frontend's --aligner); default false")


OPTION_DEFAULTS = {"sample_rate": 24000, "bit_rate": DEFAULT_BIT_RATE, "volume": 1.0, "speed": 1.0,
                   "output_format": "wav", "debug": False, "seed": None, "enable_ssml": False, "priority": None,
                   "hot_fix": None, "sentence_timestamp_enabled": False, "word_timestamp_enabled": False,
                   "language_hints": None, "enable_markdown_filter": False}


class PaiInput(PaiOptions):
    mode: Literal["fast_replication", "cross_lingual_replication", "natural_language_replication"]
    text: str = Field(min_length=1)
    reference_audio_id: str = Field(min_length=1)
    instruct: str = ""


class PaiSpeech(PaiOptions):
    model: str = "CosyVoice2-0.5B"  # any name is accepted: a frontend serves one model
    input: PaiInput
    stream: bool = True


def resolve_options(body: PaiSpeech) -> dict:
    """The options of a request: from `input` (published) or the top level (still accepted), else the
    published defaults; a field given in both places with different values is a BadRequest naming it."""
    out = {}
    for name, default in OPTION_DEFAULTS.items():
        inner, outer = getattr(body.input, name), getattr(body, name)
        if name == "bit_rate":
            inner, outer = parse_bit_rate(inner, "input.bit_rate"), parse_bit_rate(outer, "bit_rate")
        if inner is not None and outer is not None and inner != outer:
            raise BadRequest(f"{name} is given twice with different values (input.{name}="
                             f"{getattr(body.input, name)!r}, top-level {name}={getattr(body, name)!r}): send it "
                             "once, inside input as published")
        out[name] = inner if inner is not None else outer if outer is not None else default
    out["bit_rate"] = parse_bit_rate(out["bit_rate"])
    return out


def _metrics(seconds: float, elapsed: float, wait: float) -> dict:
    return {"speech_len": round(seconds, 4), "server_cost_time": round(elapsed, 4), "generate_time": round(wait, 4)}


def _answer(request_id: str, data: bytes, last: bool, metrics: dict | None, usage: dict | None = None,
            sentences: list[dict] | None = None) -> dict:
    out = {"output": {"finish_reason": "stop" if last else None,
                      "audio": {"id": request_id, "data": base64.b64encode(data).decode("ascii")}},
           "request_id": request_id, "error": None}
    if sentences is not None:
        out["output"]["sentences"] = sentences
    if usage is not None:
        out["usage"] = usage
    if metrics is not None:
        out["metrics"] = metrics
    return out


def _timestamps(o: dict) -> bool | None:
    """None: no timings asked; else whether each sentence carries its words."""
    if not (o["sentence_timestamp_enabled"] or o["word_timestamp_enabled"]):
        return None
    return bool(o["word_timestamp_enabled"])


def _mark(mark: SentenceMark, words: bool) -> dict:
    return {"type": f"sentence-{mark.kind}", "sentence": mark.sentence.to_dict(words)}


async def _events(pieces: AsyncIterator[Piece], request_id: str, debug: bool, usage: dict,
                  words: bool | None = None) -> AsyncIterator[str]:
    """SSE lines, each with `error` (null) and, with debug, `metrics`. Pieces without bytes (the codec
    still filling a frame) are merged into the next one, so every event carries audio and speech_len > 0
    (the last piece always holds some audio back: see speech_stream.HOLD_SECONDS). `words` not None:
    each event also carries the sentence marks since the previous one (`_timestamps`)."""
    seconds = wait = elapsed = 0.0
    marks: list[SentenceMark] = []
    try:
        async for p in pieces:
            seconds, wait, elapsed = seconds + p.seconds, wait + p.generate_time, p.elapsed
            marks += p.marks
            if not p.data and not p.last:
                continue
            sentences = None if words is None else [_mark(m, words) for m in marks]
            yield sse(_answer(request_id, p.data, p.last, _metrics(seconds, p.elapsed, wait) if debug else None,
                              usage if p.last else None, sentences))
            seconds = wait = 0.0
            marks = []
    except CosyError as e:  # after audio went out: the stream ends with an error event
        event = {"output": {"finish_reason": None, "audio": {"id": request_id, "data": ""}},
                 "request_id": request_id, **error_body(str(e), e.status)}
        if debug:
            event["metrics"] = _metrics(seconds, elapsed, wait)
        yield sse(event)


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
            rate = form.get("sample_rate")
            if not isinstance(rate, (str, type(None))):
                raise BadRequest("'sample_rate' must be a form field (Hz, for .pcm uploads), not a file")
            rate = check_range(rate or PCM_DEFAULT_RATE, "sample_rate", *PCM_RATE_RANGE, kind=int)
            data = await file.read(refs.max_bytes + 1)
            if len(data) > refs.max_bytes:  # a chunked body has no length to refuse it by up front
                raise PayloadTooLarge(f"the uploaded file is larger than the limit of {refs.max_bytes / 2**20:.0f} MB "
                                      "(a voice prompt needs only 3-30 s of audio)")
            return await run_in_threadpool(refs.create, data, file.filename or "", text, rate)
        finally:
            await form.close()

    async def list_reference_audio(limit: int = Query(100, ge=LIMIT_RANGE[0], le=LIMIT_RANGE[1]),
                                   order: Literal["asc", "desc"] = "desc"):
        """Reference audios (every saved voice of the data dir), by creation time."""
        return await run_in_threadpool(refs.list, limit, order)

    async def get_reference_audio(reference_audio_id: str):
        return await run_in_threadpool(refs.get, reference_audio_id)

    async def delete_reference_audio(reference_audio_id: str):
        await run_in_threadpool(refs.delete, reference_audio_id)
        return {"code": "OK", "message": f"reference audio: {reference_audio_id} deleted.", "data": {}}

    async def speech(body: PaiSpeech, request: Request):
        """Synthesize with a reference audio; SSE when `stream` (default), else one JSON answer.
        Options go inside `input` (as published); the top level is still accepted."""
        received, request_id = time.monotonic(), str(uuid.uuid4())
        inp = body.input
        if MODES[inp.mode] == "instruct" and not inp.instruct.strip():
            raise BadRequest("input.instruct is required for natural_language_replication "
                             "(e.g. '用四川话说这句话')")
        o = resolve_options(body)
        words = _timestamps(o)
        synthesis = SynthesisRequest(mode=MODES[inp.mode], text=inp.text, voice_id=inp.reference_audio_id,
                                     instruct_text=inp.instruct, speed=o["speed"], seed=o["seed"],
                                     stream=body.stream, ssml=o["enable_ssml"], priority=o["priority"],
                                     hot_fix=parse_hot_fix(o["hot_fix"], "input.hot_fix"),
                                     word_timestamps=bool(words),
                                     language=check_language(o["language_hints"], "input.language_hints"),
                                     markdown=bool(o["enable_markdown_filter"]))
        req = SpeechRequest(synthesis, "pai", fmt=o["output_format"], sample_rate=o["sample_rate"],
                            bit_rate=o["bit_rate"], volume=o["volume"])
        pieces = await open_speech(service, refs, req, received, request)  # a client leaving cancels the job
        headers = {"X-Request-Id": request_id}
        usage = {"characters": len(inp.text)}
        if body.stream:
            return StreamingResponse(_events(pieces, request_id, o["debug"], usage, words),
                                     media_type="text/event-stream", headers={**headers, "Cache-Control": "no-cache"})
        data, seconds, wait, elapsed = bytearray(), 0.0, 0.0, 0.0
        spoken: list[dict] = []

        async def collect() -> None:
            nonlocal data, seconds, wait, elapsed
            async for p in pieces:
                data += p.data
                seconds, wait, elapsed = seconds + p.seconds, wait + p.generate_time, p.elapsed
                spoken.extend(m.sentence.to_dict(bool(words)) for m in p.marks if m.kind == "end")

        try:
            await until_disconnected(request, collect())
        finally:
            await pieces.aclose()
        m = _metrics(seconds, elapsed, wait) if o["debug"] else None
        return JSONResponse(_answer(request_id, bytes(data), True, m, usage, None if words is None else spoken),
                            headers=headers)

    ref = f"{BASE}/reference_audio"
    add_route(router, "POST", ref, create_reference_audio, summary="Upload a reference audio")
    add_route(router, "GET", ref, list_reference_audio, summary="List reference audios")
    add_route(router, "GET", ref + "/{reference_audio_id}", get_reference_audio, summary="Get a reference audio")
    add_route(router, "DELETE", ref + "/{reference_audio_id}", delete_reference_audio,
              summary="Delete a reference audio")
    add_route(router, "POST", f"{BASE}/speech", speech, summary="Synthesize speech (PAI)")
    return router
