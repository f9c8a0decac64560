"""The duplex task protocol over a WebSocket: text streams in while audio streams out.

    ws://HOST:PORT/api-ws/v1/audio/speech   PAI's form (/work/shared/PAI-API.md): parameters mode,
                                            reference_audio_id, output_format, ...; audio as base64 in JSON
    ws://HOST:PORT/api-ws/v1/inference      DashScope's form (its SDK's SpeechSynthesizer): parameters voice,
                                            format, sample_rate, volume 0-100, rate; audio as binary frames

Client messages: `run-task` {header: {action, task_id, streaming: "duplex"}, payload: {task_group, task,
function, model, parameters, input: {}}}, then any number of `continue-task` (payload.input.text), then
`finish-task`. Server events (header.event, header.task_id): `task-started`, `result-generated` (the audio,
payload.metrics), `task-finished` (payload.usage.characters), `task-failed` (header.error_code,
header.error_message). Tasks run one after another on a connection; a bad message fails the task it names
(or answers task-failed with an empty task_id) and leaves the connection usable; a repeated finish-task is
ignored (the task's audio still comes). A message is at most MAX_MESSAGE_BYTES (the server closes the
connection with 1009, message too big, past it); a task's text at most MAX_TEXT_CHARS characters, checked
before anything else reads it; an SSML document is parsed off the event loop. A client that disconnects
cancels its task (the LM request is aborted, the worker slot freed). The dialects differ in how parameters
are read (`cosy.frontend.ws_params`) and in DashScope's sentence events: result-generated sentence-begin /
sentence-synthesis (before each audio frame) / sentence-end, one per sentence the pipeline speaks on its own
(the engine's marks, `cosy.pipeline.timing`: an end carries its original_text, the caller's own, and
usage.characters, the caller's characters through it). With sentence_timestamp_enabled or
word_timestamp_enabled the sentence objects also carry text, begin_time, end_time (ms in the audio sent;
null in a begin), begin_index, end_index (offsets into the task's text: its continue-task pieces joined as
sent, end exclusive) and, with words, DashScope's words [{text, begin_index, end_index (within the
sentence, as published), begin_time, end_time}]; the PAI dialect then sends the same marks as
result-generated events without audio, {"output": {"type": "sentence-begin" | "sentence-end", "sentence":
{...}}}, its words' offsets into the task's text. A sentence's begin goes before the audio that holds its
first sample and its end after its last (the encoder may hold a few ms of one piece's audio into the next).
"""
from __future__ import annotations

import asyncio
import base64
import json
import logging
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import replace

from starlette.websockets import WebSocket, WebSocketDisconnect

from cosy.errors import BadRequest, CosyError, echo, public_message
from cosy.frontend.reference_audio import ReferenceAudios
from cosy.frontend.service import FrontendService
from cosy.frontend.speech_stream import Piece, _in_thread, _pieces
from cosy.frontend.ws_params import Dialect, TaskParams
from cosy.pipeline.request import MAX_TEXT_CHARS, SynthesisRequest
from cosy.pipeline.timing import SentenceMark
from cosy.text.ssml import looks_like_ssml

log = logging.getLogger(__name__)
IDLE_TIMEOUT = 60.0  # seconds without a client message while a task runs (or before the first task)
# the protocol's messages (the docs' reference lists them from here)
CLIENT_ACTIONS = ("run-task", "continue-task", "finish-task")
SERVER_EVENTS = ("task-started", "result-generated", "task-finished", "task-failed")
# The largest message the protocols need (uvicorn's ws_max_size, `cosy.frontend.server`): a continue-task's
# 20,000 characters (MAX_TEXT_CHARS) at 12 bytes each, a character outside the BMP written as a JSON-escaped
# surrogate pair, is 240,000 bytes; the envelope and a 1,000-character instruction fit beside it many times.
MAX_MESSAGE_BYTES = 1 << 20
MAX_TASK_ID_CHARS = 256  # DashScope's and PAI's ids are UUIDs (32 or 36 characters); each event repeats it


class TaskFailed(Exception):
    def __init__(self, code: str, message: str, task_id: str = ""):
        super().__init__(message)
        self.code, self.message, self.task_id = code, message, task_id


def error_code(e: CosyError) -> str:
    return {400: "InvalidParameter", 401: "Unauthorized", 404: "NotFound", 422: "UnprocessableRequest",
            429: "Throttling", 503: "ServiceUnavailable"}.get(e.status, "InternalError")


def event(name: str, task_id: str, payload: dict | None = None, **header) -> str:
    return json.dumps({"header": {"event": name, "task_id": task_id, "attributes": {}, **header},
                       "payload": payload if payload is not None else {}}, ensure_ascii=False)


class Task:
    """One running task: its text queue (for the worker) and the coroutine that sends its audio."""

    def __init__(self, task_id: str, params: TaskParams):
        self.id, self.params = task_id, params
        self.text: queue.Queue = queue.Queue()
        self.characters = 0
        self.finished = False  # finish-task seen
        self.seconds = 0.0  # audio sent
        self.sender: asyncio.Task | None = None
        self.sentence = 0  # the index of the sentence being spoken (DashScope's sentence-synthesis)


class TaskSession:
    def __init__(self, ws: WebSocket, service: FrontendService, refs: ReferenceAudios, dialect: Dialect,
                 idle_timeout: float | None = None):
        self.ws, self.service, self.refs, self.dialect = ws, service, refs, dialect
        self.idle_timeout = idle_timeout or getattr(service, "ws_idle_timeout", IDLE_TIMEOUT)
        self.task: Task | None = None
        self.ended = ""  # the id of the last task that ended: a late repeat of its finish-task is ignored
        self.lock = asyncio.Lock()
        self.active = time.monotonic()  # the last client message or audio sent: the idle timer's start

    async def send(self, text: str | None = None, data: bytes | None = None) -> None:
        async with self.lock:
            if data is not None:
                await self.ws.send_bytes(data)
            else:
                await self.ws.send_text(text)
            self.active = time.monotonic()

    async def fail(self, code: str, message: str, task_id: str = "") -> None:
        """Every error a WebSocket client is sent, in the dialect's shape (`error_event`), its message as a
        client may see it (`cosy.errors.public_message`: no backend address, no server path)."""
        await self.send(self.error_event(code, public_message(message), task_id))

    def error_event(self, code: str, message: str, task_id: str) -> str:
        return event("task-failed", task_id, error_code=code, error_message=message)

    async def serve(self) -> None:
        await self.ws.accept()
        receive = None
        try:
            while True:
                receive = receive or asyncio.ensure_future(self.ws.receive())
                task = self.task
                if task is not None and task.finished and task.sender is not None:
                    # the client sent all its text and waits for its audio: not idle, however slow the
                    # server is (a stalled backend fails the task: --llm_stall_timeout); the idle clock
                    # starts again when the task ends
                    await asyncio.wait({receive, task.sender}, return_when=asyncio.FIRST_COMPLETED)
                    if not receive.done():
                        self.active = max(self.active, time.monotonic())
                        continue
                else:
                    await asyncio.wait({receive}, timeout=max(0.0, self.active + self.idle_timeout - time.monotonic()))
                if receive.done():
                    msg, receive = receive.result(), None
                    self.active = time.monotonic()
                elif time.monotonic() < self.active + self.idle_timeout:
                    continue  # audio went out meanwhile: the client is not idle
                else:
                    receive.cancel()
                    if self.task is not None:
                        await self.fail("IdleTimeout", f"no message for {self.idle_timeout:g} s; the task was "
                                        "cancelled", self.task.id)
                        await self.stop_task()
                    await self.ws.close(1000, "idle")
                    return
                if msg["type"] == "websocket.disconnect":
                    return
                try:
                    await self.handle(msg)
                except TaskFailed as e:
                    if self.task is not None and e.task_id == self.task.id:
                        await self.stop_task()
                    await self.fail(e.code, e.message, e.task_id)
        except WebSocketDisconnect:
            return
        finally:
            if receive is not None:
                receive.cancel()
            await self.stop_task()

    async def handle(self, msg: dict) -> None:
        if msg.get("text") is None:
            raise TaskFailed("InvalidMessage", "binary frames are not accepted from the client: send JSON text "
                             "messages (run-task, continue-task, finish-task)", self.task.id if self.task else "")
        try:
            body = json.loads(msg["text"])
            header = body["header"]
            action, task_id = header["action"], header.get("task_id") or ""
            payload = body.get("payload") or {}
        except (ValueError, KeyError, TypeError, RecursionError):  # RecursionError: JSON nested too deeply
            raise TaskFailed("InvalidMessage", "a message must be JSON {\"header\": {\"action\", \"task_id\", "
                             "\"streaming\": \"duplex\"}, \"payload\": {...}}") from None
        if not isinstance(task_id, str) or not isinstance(payload, dict):
            raise TaskFailed("InvalidMessage", "header.task_id must be a string and payload an object")
        if len(task_id) > MAX_TASK_ID_CHARS:
            raise TaskFailed("InvalidParameter", f"header.task_id is {len(task_id)} characters; at most "
                             f"{MAX_TASK_ID_CHARS} (a UUID)")
        if action == "run-task":
            await self.run_task(task_id, payload)
        elif action in ("continue-task", "finish-task"):
            task = self.task
            if action == "finish-task" and task_id and task_id == (task.id if task and task.finished else self.ended):
                return  # a repeated finish-task: the task is finishing (or has ended) as asked
            if task is None or task.id != task_id:
                running = f"the running task is {task.id!r}" if task else "no task runs: send run-task first"
                raise TaskFailed("InvalidTask", f"{action} for task {task_id!r}, but {running}", task_id)
            if task.finished:
                raise TaskFailed("InvalidTask", f"{action} after finish-task", task_id)
            if action == "continue-task":
                await self.continue_text(task, payload)
            else:
                task.finished = True
                task.text.put(None)
        else:
            raise TaskFailed("InvalidMessage", f"unknown action {echo(action)}: use {', '.join(CLIENT_ACTIONS)}",
                             task_id)

    async def continue_text(self, task: Task, payload: dict) -> None:
        inp = payload.get("input") if isinstance(payload.get("input"), dict) else {}
        text = inp.get("text")
        if text is None and inp.get("flush"):  # DashScope's flush: our text goes to the LM as it comes
            return
        if not isinstance(text, str):
            raise TaskFailed("InvalidParameter", "continue-task needs payload.input.text (a string)", task.id)
        await self.add_text(task, text)

    text_message = "continue-task"  # the message that carries text, for errors (the OpenAI style: input.text)

    async def add_text(self, task: Task, text: str) -> None:
        """One piece of the task's text: its length first (nothing reads a text past the limit), then with
        enable_ssml the document, checked off the event loop; then it goes to the worker."""
        total = task.characters + len(text)
        if total > MAX_TEXT_CHARS:
            raise TaskFailed("InvalidParameter", f"the task's text is {total} characters; the limit is "
                             f"{MAX_TEXT_CHARS}: start a new task for more", task.id)
        if task.params.ssml:
            await self.ssml_text(task, text)
        task.characters = total
        if text:
            task.text.put(text)

    async def ssml_text(self, task: Task, text: str) -> None:
        """enable_ssml: the one message holds the whole document, checked now (a 400's message with the line
        and column fails the task before any audio), in a thread: parsing is CPU work."""
        if task.characters:
            raise TaskFailed("InvalidParameter", f"enable_ssml: the SSML document comes whole in one "
                             f"{self.text_message} (as published); start a new task for more", task.id)
        try:
            await asyncio.to_thread(lambda: _as_document(task.params, text).check())
        except CosyError as e:
            raise TaskFailed(error_code(e), str(e), task.id) from None

    async def run_task(self, task_id: str, payload: dict) -> None:
        if not task_id:
            raise TaskFailed("InvalidParameter", "run-task needs header.task_id")
        if self.task is not None:
            raise TaskFailed("InvalidTask", f"task {self.task.id!r} is still running: one task at a time on a "
                             "connection (wait for its task-finished)", task_id)
        await self.start_task(task_id, lambda: self.dialect.parse(payload))

    async def start_task(self, task_id: str, parse) -> None:
        """Parse the parameters, check the voice, announce the task and start its audio."""
        try:
            params = parse()
            await asyncio.to_thread(self.refs.get, params.speech.synthesis.voice_id)  # unknown voice: fail now
        except CosyError as e:
            raise TaskFailed(error_code(e), str(e), task_id) from None
        task = self.task = Task(task_id, params)
        await self.started(task)
        task.sender = asyncio.create_task(self.stream(task))

    # the events (the OpenAI-style session overrides them)
    async def started(self, task: Task) -> None:
        await self.send(event("task-started", task.id))

    async def sentence_marks(self, task: Task, marks: list[SentenceMark]) -> None:
        """The sentence events of `marks`, in order (`mark_event`)."""
        for m in marks:
            if m.kind == "begin":
                task.sentence = m.sentence.index
            if (text := self.mark_event(task, m)) is not None:
                await self.send(text)

    def mark_event(self, task: Task, mark: SentenceMark) -> str | None:
        """DashScope: sentence-begin / sentence-end (result-generated without audio), timings when asked;
        PAI: the same events only when timings were asked, the sentence in our shape (module docstring)."""
        words, s = task.params.timestamps, mark.sentence
        if not self.dialect.sentence_events:
            if words is None:
                return None
            return event("result-generated", task.id, {"output": {"type": f"sentence-{mark.kind}",
                                                                  "sentence": s.to_dict(words)}})
        sentence = {"index": s.index, "words": []}
        if words is not None:
            sentence = {**s.to_dict(), "words": [{"text": w.text, "begin_index": w.begin_index - s.begin_index,
                                                  "end_index": w.end_index - s.begin_index,
                                                  "begin_time": w.begin_time, "end_time": w.end_time}
                                                 for w in s.words] if words else []}
        output = {"sentence": sentence, "type": f"sentence-{mark.kind}"}
        payload = {"output": output}
        if mark.kind == "end":
            output["original_text"] = s.text
            payload["usage"] = {"characters": s.end_index}
        return event("result-generated", task.id, payload)

    async def audio(self, task: Task, data: bytes, metrics: dict) -> None:
        if self.dialect.sentence_events:  # DashScope: the event, then its frame; the sentence being spoken
            output = {"sentence": {"index": task.sentence, "words": []}, "type": "sentence-synthesis"}
            await self.send(event("result-generated", task.id, {"output": output, "metrics": metrics}))
            await self.send(data=data)
        elif task.params.binary:
            await self.send(data=data)
            await self.send(event("result-generated", task.id, {"output": {}, "metrics": metrics}))
        else:
            audio = {"data": base64.b64encode(data).decode("ascii")}
            await self.send(event("result-generated", task.id, {"output": {"audio": audio}, "metrics": metrics}))

    async def finished(self, task: Task) -> None:
        await self.send(event("task-finished", task.id, {"output": {}, "usage": {"characters": task.characters}}))

    async def stream(self, task: Task) -> None:
        received = time.monotonic()
        p = task.params
        pieces = _in_thread(lambda stop: _ssml_pieces(self.service, self.refs, p, received, stop, task.text)
                            if p.ssml else _pieces(self.service, self.refs, p.speech, received, stop, task.text))
        seconds = wait = 0.0
        marks: list[SentenceMark] = []
        try:
            async for piece in pieces:
                marks += piece.marks
                seconds, wait = seconds + piece.seconds, wait + piece.generate_time
                if not piece.data and not piece.last:
                    continue  # the codec is still filling a frame: merged into the next event
                # the ends after the last begin close sentences whose last audio is (partly) in this piece
                cut = max((k + 1 for k, m in enumerate(marks) if m.kind == "begin"), default=0)
                await self.sentence_marks(task, marks[:cut])
                if piece.data or seconds > 0:
                    metrics = {"speech_len": round(seconds, 4), "server_cost_time": round(piece.elapsed, 4),
                               "generate_time": round(wait, 4)}
                    await self.audio(task, piece.data, metrics)
                    seconds = wait = 0.0
                await self.sentence_marks(task, marks[cut:])
                marks = []
            await self.finished(task)
        except CosyError as e:
            with suppress(Exception):
                await self.fail(error_code(e), str(e), task.id)
        except (WebSocketDisconnect, asyncio.CancelledError):
            raise
        except Exception as e:  # ours: said as such, the connection stays usable
            log.exception("WebSocket task %s failed", task.id)
            with suppress(Exception):
                await self.fail("InternalError", f"{type(e).__name__}: {e}", task.id)
        finally:
            await pieces.aclose()
            self.ended = task.id
            if self.task is task:
                self.task = None

    async def stop_task(self) -> None:
        """Cancel the running task (its job in the pool with it) and wait until it is gone."""
        task, self.task = self.task, None
        if task is None or task.sender is None:
            return
        task.sender.cancel()
        with suppress(asyncio.CancelledError, Exception):
            await task.sender


def _as_document(params: TaskParams, text: str) -> SynthesisRequest:
    """An enable_ssml task's request for its one text: SSML, or (DashScope, text not <speak>...) plain."""
    ssml = not params.plain_ok or looks_like_ssml(text)
    return replace(params.speech.synthesis, text=text, ssml=ssml, duplex=False)


def _ssml_pieces(service: FrontendService, refs: ReferenceAudios, params: TaskParams, received: float,
                 stop: threading.Event, text: queue.Queue) -> Iterator[Piece]:
    """enable_ssml: wait for the task's one document (its continue-task), then speak it whole (not duplex:
    SSML's breaks and readings need the whole text)."""
    while not stop.is_set():
        try:
            doc = text.get(timeout=0.2)
        except queue.Empty:
            continue
        if doc is None:
            raise BadRequest("enable_ssml: finish-task came before the SSML document (one continue-task)")
        speech = replace(params.speech, synthesis=_as_document(params, doc))
        yield from _pieces(service, refs, speech, received, stop)
        return


__all__ = ["IDLE_TIMEOUT", "MAX_MESSAGE_BYTES", "TaskSession", "event"]
