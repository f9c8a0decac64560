"""`POST /v1/audio/speech/batch`: up to 32 speech requests in one call, in vLLM-Omni's shape (docs/api/voices.md).

    {"model": "...", "voice": "alice", "response_format": "wav", "speed": 1.0, "priority": "bulk",
     "items": [{"input": "第一句。"}, {"input": "第二句。", "voice": "bob", "response_format": "mp3"}]}
 -> {"id": "batch_...", "object": "speech.batch", "total": 2, "succeeded": 2, "failed": 0,
     "results": [{"index": 0, "status": "success", "audio_data": "<base64>", "media_type": "audio/wav",
                  "error": null, "code": null}, ...]}

The top-level fields are every item's defaults; an item's own fields (those of `POST /v1/audio/speech`:
input, voice, instructions, response_format, speed, seed, enable_ssml) override them. 1-32 items (else 400
naming `items`); each item is checked alone, so a bad item (a missing input, an unknown voice, a voice of
another model family) fails alone: status "error" with its message and HTTP code, the others still run.
The items run concurrently in the worker pool (at most BATCH_CONCURRENCY at a time, so a batch cannot fill
the queue alone) at the batch's own priority class: `priority` of the batch (items cannot set their own);
without one, "default", the class of every whole-file request (`FrontendService.priority_of`): a batch
answers once all its items are done, as one file would. "bulk" puts it behind everything else. An item
refused by a full queue fails alone with code 429 (retry it). A client that disconnects cancels every item.
The batch's JSON is bounded like every API request body (MAX_BODY_BYTES).
"""
from __future__ import annotations

import asyncio
import base64
import logging
import threading
import uuid
from typing import Any, Literal, Union

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool

from cosy.errors import CosyError, public_message
from cosy.frontend.api_routing import add_route, api_router, describe_validation
from cosy.frontend.encoding import FORMATS, MEDIA_TYPES, make_encoder
from cosy.frontend.openai_api import OpenAISpeech, VoiceId
from cosy.frontend.service import FrontendService
from cosy.frontend.speech_stream import until_disconnected
from cosy.pipeline.request import PRIORITIES, SEED_RANGE, SPEED_RANGE, SynthesisRequest

log = logging.getLogger(__name__)
MAX_ITEMS = 32
BATCH_CONCURRENCY = 8  # items of one batch in the worker queue at once
BATCH_ONLY = ("items", "priority", "model")  # fields of the batch that are not an item's defaults


class SpeechBatch(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    items: list[Any] = Field(min_length=1, max_length=MAX_ITEMS)  # each checked alone (a bad one fails alone)
    voice: Union[str, VoiceId, None] = None
    instructions: str | None = None
    response_format: Literal[FORMATS] = "wav"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    enable_ssml: bool = False
    priority: Literal[PRIORITIES] | None = None  # the whole batch's class (None: "default")


def item_request(batch: SpeechBatch, index: int, item: object) -> tuple[SynthesisRequest, str]:
    """An item with the batch's defaults -> its synthesis request and output format; CosyError (400) naming
    items[index] and the field."""
    if not isinstance(item, dict):
        raise CosyError(f"items[{index}] must be an object with at least 'input'", 400)
    defaults = {k: v for k, v in batch.model_dump().items() if k not in BATCH_ONLY and v is not None}
    own = {k: v for k, v in item.items() if k not in ("priority", "stream_format") and v is not None}
    try:
        body = OpenAISpeech(**{**defaults, **own, "model": batch.model or "batch"})
    except ValidationError as e:
        raise CosyError(f"items[{index}]: " + describe_validation(list(e.errors())), 400) from None
    voice = body.voice.id if isinstance(body.voice, VoiceId) else body.voice
    instruct = body.instructions.strip()
    req = SynthesisRequest(mode="instruct" if instruct else "voice", text=body.input, voice_id=voice,
                           instruct_text=instruct, speed=min(max(body.speed, SPEED_RANGE[0]), SPEED_RANGE[1]),
                           seed=body.seed, stream=False, ssml=body.enable_ssml, priority=batch.priority)
    return req, body.response_format


def _encode(audio, sample_rate: int, fmt: str) -> bytes:
    encoder = make_encoder(fmt, sample_rate, streaming=False)
    try:
        return encoder.encode(audio) + encoder.finish()
    finally:
        encoder.close()


def build_batch_router(service: FrontendService, dependencies: list) -> APIRouter:
    router = api_router(dependencies=dependencies, tags=["OpenAI-compatible"])

    async def create_speech_batch(body: SpeechBatch, request: Request):
        """Synthesize 1-32 items concurrently; base64 audio or an error per item."""
        cancelled = threading.Event()
        slots = asyncio.Semaphore(BATCH_CONCURRENCY)

        def run(index: int, item: object) -> dict:
            req, fmt = item_request(body, index, item)
            result = service.synthesize(req, "openai", cancelled)
            return {"index": index, "status": "success",
                    "audio_data": base64.b64encode(_encode(result.audio, result.sample_rate, fmt)).decode("ascii"),
                    "media_type": MEDIA_TYPES[fmt], "error": None, "code": None}

        async def one(index: int, item: object) -> dict:
            async with slots:
                try:
                    return await run_in_threadpool(run, index, item)
                except CosyError as e:
                    if e.status >= 500:
                        log.warning("batch item %d: %s", index, e)
                    return {"index": index, "status": "error", "audio_data": None, "media_type": None,
                            "error": public_message(str(e)), "code": e.status}
                except Exception:
                    log.exception("batch item %d failed", index)
                    return {"index": index, "status": "error", "audio_data": None, "media_type": None,
                            "error": "internal error (the frontend's log has the details)", "code": 500}

        try:
            results = await until_disconnected(request, asyncio.gather(*(one(i, it) for i, it in
                                                                          enumerate(body.items))))
        finally:
            cancelled.set()  # a client gone: every item still queued or running is cancelled
        ok = sum(r["status"] == "success" for r in results)
        return {"id": f"batch_{uuid.uuid4().hex}", "object": "speech.batch", "total": len(results),
                "succeeded": ok, "failed": len(results) - ok, "results": results}

    add_route(router, "POST", "/v1/audio/speech/batch", create_speech_batch, summary="Create speech in a batch")
    return router
