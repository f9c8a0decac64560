"""OpenAI's `POST /v1/audio/speech`, so the official clients work against a frontend:

    client = openai.OpenAI(base_url="http://FRONTEND:7860/v1", api_key="KEY or anything")
    client.audio.speech.create(model="CosyVoice2-0.5B", voice="ref_0123456789ab", input="...")

Fields: model (any name), input, voice (a reference-audio id or saved voice id, or {"id": ...}),
instructions (-> instruct mode, "用四川话说这句话"; without: zero-shot with the voice's saved transcript),
response_format mp3 (default) | opus | aac | flac | wav | pcm (24 kHz s16le mono), speed 0.25-4.0,
stream_format audio (default) | sse, and the extensions `seed` (same seed, same audio), `enable_ssml`
(`input` is SSML) and `priority` (interactive, the default: the answer streams; default or bulk for work
that can wait; see `FrontendService.priority_of`).

stream_format audio: the encoded file as a chunked body, bytes sent as soon as the codec has them (flac
is sent when complete: its header holds the length). sse: `data: {"type": "speech.audio.delta", "audio":
"<base64>"}` per piece, then `data: {"type": "speech.audio.done", "usage": {...}}` (input_tokens counts
characters, output_tokens speech tokens at 25 Hz: there is no text tokenizer in this process).

Speed: the engine scales the mel length within 0.5-2.0 (pitch kept). OpenAI's wider range is clamped to
that: resampling would shift the pitch, and a time-stretch beyond 2x is not speech worth sending anyway.
The speed applied is in the `X-Cosy-Speed` response header.

Timestamps (extensions, docs/api/timestamps.md): `sentence_timestamp_enabled`, or `word_timestamp_enabled`
(the managed CosyVoice service's name; needs the frontend's --aligner). With stream_format sse, beside the
audio deltas, in the order they happen: `data: {"type": "speech.sentence.begin", "sentence": {...}}` before
the delta holding a sentence's first audio, `{"type": "speech.sentence.end", "sentence": {...}}` before the
delta holding its last 20 ms (the stream holds them back until the next piece; `speech_stream.HOLD_SECONDS`).
OpenAI publishes no timing events; these are ours. With stream_format audio the timings are only
known at the end and a bare audio body has no place for them (a header would outgrow what clients read:
httpx stops at 16 KiB of headers, a long text has hundreds of sentences), so the answer becomes JSON:
`{"audio": "<base64 of the whole file in response_format>", "sentences": [...], "usage": {...}}`. A sentence
is `{index, text, begin_time, end_time (ms; null in a begin), begin_index, end_index (offsets into input,
end exclusive)}`, with `words` when word timings were asked.
"""
from __future__ import annotations

import base64
import logging
import time
import uuid
from collections.abc import AsyncIterator
from typing import Literal, Union

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from cosy.errors import CosyError
from cosy.frontend.api_routing import add_route, api_router, error_body, sse
from cosy.frontend.encoding import FORMATS, MEDIA_TYPES
from cosy.frontend.reference_audio import ReferenceAudios
from cosy.frontend.service import FrontendService
from cosy.frontend.speech_stream import Piece, SpeechRequest, open_speech, until_disconnected
from cosy.frontend.text_params import TextControls, language_of
from cosy.pipeline.request import PRIORITIES, SEED_RANGE, SPEED_RANGE, SynthesisRequest
from cosy.pipeline.timing import SentenceMark
from cosy.text.lexicon import parse_hot_fix

log = logging.getLogger(__name__)


class VoiceId(BaseModel):
    id: str = Field(min_length=1)


class OpenAISpeech(TextControls):  # (with language_hints and enable_markdown_filter, extensions)
    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1)
    input: str = Field(min_length=1)
    voice: Union[str, VoiceId]
    instructions: str = ""
    response_format: Literal[FORMATS] = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    enable_ssml: bool = False  # an extension: `input` is SSML (README "SSML")
    hot_fix: dict | None = None  # an extension: pronunciation fixes, the managed service's shape (cosy.text.lexicon)
    priority: Literal[PRIORITIES] | None = None  # an extension: the class (None: interactive, a stream's)
    sentence_timestamp_enabled: bool = False  # an extension: sentence timings (module docstring)
    word_timestamp_enabled: bool = False  # the managed service's name: sentence timings with their words

    def timestamps(self) -> bool | None:
        """None: no timings asked; else whether each sentence carries its words."""
        if not (self.sentence_timestamp_enabled or self.word_timestamp_enabled):
            return None
        return self.word_timestamp_enabled


async def _audio(pieces: AsyncIterator[Piece], request_id: str) -> AsyncIterator[bytes]:
    try:
        async for p in pieces:
            if p.data:
                yield p.data
    except CosyError as e:
        # headers are gone: abort the chunked body, so that the client sees an error, not a short file
        log.warning("speech %s failed after audio was sent: %s", request_id, e)
        raise


def _usage(characters: int, seconds: float, tokens_per_second: int) -> dict:
    out = round(seconds * tokens_per_second)
    return {"input_tokens": characters, "output_tokens": out, "total_tokens": characters + out}


def _mark(mark: SentenceMark, words: bool) -> dict:
    return {"type": f"speech.sentence.{mark.kind}", "sentence": mark.sentence.to_dict(words)}


async def _events(pieces: AsyncIterator[Piece], request_id: str, characters: int,
                  tokens_per_second: int, words: bool | None = None) -> AsyncIterator[str]:
    """The SSE lines; `words` not None: the sentence marks too, each before the delta of the piece it came with."""
    seconds = 0.0
    try:
        async for p in pieces:
            seconds += p.seconds
            if words is not None:
                for m in p.marks:
                    yield sse(_mark(m, words))
            if p.data:
                yield sse({"type": "speech.audio.delta", "audio": base64.b64encode(p.data).decode("ascii")})
        yield sse({"type": "speech.audio.done", "usage": _usage(characters, seconds, tokens_per_second)})
    except CosyError as e:
        yield sse({"type": "error", **error_body(str(e), e.status), "request_id": request_id})


async def _timed_file(pieces: AsyncIterator[Piece], characters: int, tokens_per_second: int,
                      words: bool) -> dict:
    """The whole file and its sentences, as one JSON answer (the audio form with timestamps asked)."""
    data, seconds, sentences = bytearray(), 0.0, []
    try:
        async for p in pieces:
            data += p.data
            seconds += p.seconds
            sentences += [m.sentence.to_dict(words) for m in p.marks if m.kind == "end"]
    finally:
        await pieces.aclose()
    return {"audio": base64.b64encode(bytes(data)).decode("ascii"), "sentences": sentences,
            "usage": _usage(characters, seconds, tokens_per_second)}


def build_openai_router(service: FrontendService, refs: ReferenceAudios, dependencies: list) -> APIRouter:
    router = api_router(dependencies=dependencies, tags=["OpenAI-compatible"])

    async def create_speech(body: OpenAISpeech, request: Request):
        """OpenAI's text-to-speech endpoint, over this frontend's saved voices."""
        received, request_id = time.monotonic(), uuid.uuid4().hex
        voice = body.voice.id if isinstance(body.voice, VoiceId) else body.voice
        speed = min(max(body.speed, SPEED_RANGE[0]), SPEED_RANGE[1])
        instruct = body.instructions.strip()
        # without instructions: zero-shot with the voice's stored transcript (our mode 'voice')
        synthesis = SynthesisRequest(mode="instruct" if instruct else "voice", text=body.input, voice_id=voice,
                                     instruct_text=instruct, speed=speed, seed=body.seed, stream=True,
                                     ssml=body.enable_ssml, priority=body.priority,
                                     hot_fix=parse_hot_fix(body.hot_fix),
                                     word_timestamps=body.word_timestamp_enabled, language=language_of(body),
                                     markdown=bool(body.enable_markdown_filter))
        req = SpeechRequest(synthesis, "openai", fmt=body.response_format, sample_rate=service.sample_rate)
        pieces = await open_speech(service, refs, req, received, request)  # a client leaving cancels the job
        headers = {"X-Request-Id": request_id, "X-Cosy-Speed": f"{speed:g}"}
        rate, words = service.family.token_frame_rate, body.timestamps()
        if body.stream_format == "sse":
            events = _events(pieces, request_id, len(body.input), rate, words)
            return StreamingResponse(events, media_type="text/event-stream",
                                     headers={**headers, "Cache-Control": "no-cache"})
        if words is not None:
            answer = await until_disconnected(request, _timed_file(pieces, len(body.input), rate, words))
            return JSONResponse(answer, headers=headers)
        return StreamingResponse(_audio(pieces, request_id), media_type=MEDIA_TYPES[body.response_format],
                                 headers=headers)

    add_route(router, "POST", "/v1/audio/speech", create_speech, summary="Create speech (OpenAI)")
    return router
