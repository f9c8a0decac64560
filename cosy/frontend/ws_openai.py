"""`ws://HOST:PORT/v1/audio/speech/stream`: a light session protocol for OpenAI-style clients, text in while audio
streams out, with the fields of `POST /v1/audio/speech` (`cosy.frontend.openai_api`).

Client -> server (JSON text messages):
    {"type": "session.config", "voice": "<reference audio / saved voice id>", "instructions": "",
     "response_format": "mp3" | "opus" | "aac" | "flac" | "wav" | "pcm", "speed": 1.0, "seed": null,
     "enable_ssml": false, "priority": null (interactive; default or bulk for work that can wait),
     "sentence_timestamp_enabled": false, "word_timestamp_enabled": false (timings, as on POST /v1/audio/speech),
     "language_hints": null, "enable_markdown_filter": false, "hot_fix": null (text control, as on the HTTP route)}
    {"type": "input.text", "delta": "<more text>"}          any number (with enable_ssml: one, the whole document)
    {"type": "input.done"}                                   (a repeated one is ignored)
Server -> client:
    {"type": "session.created", "session_id", "voice", "response_format", "sample_rate"}
    {"type": "speech.audio.delta", "session_id", "audio": "<base64 of the next bytes of the file>"}
    {"type": "speech.sentence.begin" | "speech.sentence.end", "session_id", "sentence": {index, text, begin_time,
     end_time (ms; null in a begin), begin_index, end_index (offsets into the input.text deltas joined, end
     exclusive), words (with word_timestamp_enabled)}}  only when timings were asked: a begin before the delta
     holding the sentence's first audio, an end after the one holding its last (OpenAI publishes no timing
     events; the names are those of the HTTP route's SSE, `cosy.frontend.openai_api`)
    {"type": "speech.audio.done", "session_id", "usage": {"input_tokens" (characters), "output_tokens" (speech
     tokens at 25 Hz), "total_tokens"}}
    {"type": "error", "session_id", "error": {"code", "message"}}
One utterance per session.config; after speech.audio.done (or an error) the next session.config starts another.
enable_ssml: the one input.text is an SSML document (README "SSML"), checked when it arrives (an error names
its line and column before any audio), as on the PAI and DashScope sockets.
"""
from __future__ import annotations

import base64
import json
import uuid
from typing import Literal

from pydantic import ConfigDict, Field

from cosy.errors import echo
from cosy.frontend.encoding import FORMATS
from cosy.frontend.speech_stream import SpeechRequest
from cosy.frontend.text_params import TextControls, language_of
from cosy.frontend.ws_params import Dialect, TaskParams, TimestampParameters, _validated
from cosy.frontend.ws_tasks import Task, TaskFailed, TaskSession
from cosy.pipeline.request import PRIORITIES, SEED_RANGE, SPEED_RANGE, SynthesisRequest
from cosy.pipeline.timing import SentenceMark
from cosy.text.lexicon import parse_hot_fix


class SessionConfig(TimestampParameters, TextControls):
    model_config = ConfigDict(extra="ignore")
    voice: str = Field(min_length=1)
    instructions: str = ""
    response_format: Literal[FORMATS] = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0)  # clamped to what the engine does, as the HTTP API
    seed: int | None = Field(None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    enable_ssml: bool = False  # the one input.text is an SSML document
    priority: Literal[PRIORITIES] | None = None  # the class (None: interactive, a stream's)
    hot_fix: dict | None = None  # pronunciation fixes (`cosy.text.lexicon.parse_hot_fix`), as on the HTTP route


class OpenAIDialect(Dialect):
    name = "openai"

    def __init__(self, sample_rate: int):
        self.sample_rate = sample_rate

    def parse(self, payload: dict) -> TaskParams:
        c = _validated(SessionConfig, {"parameters": payload}, "")
        instruct = c.instructions.strip()
        speed = min(max(c.speed, SPEED_RANGE[0]), SPEED_RANGE[1])
        synthesis = SynthesisRequest(mode="instruct" if instruct else "voice", voice_id=c.voice,
                                     instruct_text=instruct, speed=speed, seed=c.seed, stream=True, duplex=True,
                                     priority=c.priority, word_timestamps=bool(c.timestamps()),
                                     hot_fix=parse_hot_fix(c.hot_fix, "hot_fix"), language=language_of(c),
                                     markdown=bool(c.enable_markdown_filter))
        speech = SpeechRequest(synthesis, "openai", fmt=c.response_format, sample_rate=self.sample_rate)
        return TaskParams(speech, False, c.enable_ssml, timestamps=c.timestamps())


class OpenAISession(TaskSession):
    text_message = "input.text"

    async def handle(self, msg: dict) -> None:
        sid = self.task.id if self.task else ""
        if msg.get("text") is None:
            raise TaskFailed("invalid_message", "binary frames are not accepted: send JSON text messages", sid)
        try:
            body = json.loads(msg["text"])
            kind = body["type"]
        except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: JSON nested too deeply
            raise TaskFailed("invalid_message", 'a message must be JSON {"type": "session.config" | "input.text" | '
                             '"input.done", ...}', sid) from None
        if kind == "session.config":
            if self.task is not None:
                raise TaskFailed("session_busy", f"session {sid} is still speaking: wait for speech.audio.done",
                                 sid)
            await self.start_task(uuid.uuid4().hex, lambda: self.dialect.parse(body))
        elif kind in ("input.text", "input.done"):
            task = self.task
            if kind == "input.done" and task is not None and task.finished:
                return  # a repeated input.done: the session is finishing as asked
            if task is None or task.finished:
                raise TaskFailed("no_session", f"{kind} without a session: send session.config first"
                                 if task is None else f"{kind} after input.done", sid)
            if kind == "input.done":
                task.finished = True
                task.text.put(None)
            elif not isinstance(body.get("delta"), str):
                raise TaskFailed("invalid_parameter", "input.text needs delta (a string)", sid)
            else:
                await self.add_text(task, body["delta"])
        else:
            raise TaskFailed("invalid_message", f"unknown type {echo(kind)}: use session.config, input.text or "
                             "input.done", sid)

    async def started(self, task: Task) -> None:
        s = task.params.speech
        await self.send(json.dumps({"type": "session.created", "session_id": task.id, "voice": s.synthesis.voice_id,
                                    "response_format": s.fmt, "sample_rate": s.sample_rate}))

    async def audio(self, task: Task, data: bytes, metrics: dict) -> None:
        task.seconds += metrics["speech_len"]
        await self.send(json.dumps({"type": "speech.audio.delta", "session_id": task.id,
                                    "audio": base64.b64encode(data).decode("ascii")}))

    def mark_event(self, task: Task, mark: SentenceMark) -> str | None:
        words = task.params.timestamps
        if words is None:
            return None
        sentence = mark.sentence.to_dict(words)
        if mark.kind != "end":  # a begin
            return json.dumps({"type": "speech.sentence.begin", "session_id": task.id, "sentence": sentence},
                              ensure_ascii=False)
        return json.dumps({"type": "speech.sentence.end", "session_id": task.id, "sentence": sentence},
                          ensure_ascii=False)

    async def finished(self, task: Task) -> None:
        out = round(task.seconds * self.service.family.token_frame_rate)
        await self.send(json.dumps({"type": "speech.audio.done", "session_id": task.id,
                                    "usage": {"input_tokens": task.characters, "output_tokens": out,
                                              "total_tokens": task.characters + out}}))

    def error_event(self, code: str, message: str, task_id: str) -> str:
        return json.dumps({"type": "error", "session_id": task_id,
                           "error": {"code": _CODES.get(code, code), "message": message}})


# the session's messages (the docs' reference lists them from here)
CLIENT_TYPES = ("session.config", "input.text", "input.done")
SERVER_TYPES = ("session.created", "speech.audio.delta", "speech.sentence.begin", "speech.sentence.end",
                "speech.audio.done", "error")

# the task protocol's codes in OpenAI's snake_case
_CODES = {"InvalidParameter": "invalid_parameter", "InvalidMessage": "invalid_message", "InvalidTask": "no_session",
          "NotFound": "not_found", "IdleTimeout": "idle_timeout", "Throttling": "rate_limited",
          "ServiceUnavailable": "unavailable", "InternalError": "internal_error", "Unauthorized": "unauthorized",
          "UnprocessableRequest": "unprocessable_request"}

__all__ = ["OpenAIDialect", "OpenAISession", "SessionConfig"]
