"""One speech request of the HTTP APIs: synthesis (shared worker queue) -> volume, rate -> encoded bytes.

The blocking part (waiting in the queue, the chunks, resampling and encoding) runs in a thread of its own
per request, not in the event loop nor in its small thread pool: a frontend may hold as many open streams
as its queue admits, and past that the queue answers 429 at once. The first piece is awaited before any
HTTP answer is started (`open_speech`), so a full queue, an unknown voice or a bad setting is a proper
4xx/5xx JSON error; a failure after audio went out ends the stream (SSE: with an error event).
A client that goes away cancels its job in the pool at once, wherever it is (waiting in the queue, in the
LM, in flow/HiFT): Starlette cancels a streaming body whose client left, and `until_disconnected` watches
the client while a route still awaits (the first piece, or a whole non-streaming answer).
"""
from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from cosy.errors import CosyError
from cosy.frontend.audio_out import OutputAudio
from cosy.frontend.encoding import make_encoder
from cosy.frontend.reference_audio import ReferenceAudios
from cosy.frontend.service import FrontendService
from cosy.pipeline.request import SynthesisRequest
from cosy.pipeline.timing import SentenceMark


@dataclass
class SpeechRequest:
    """What to synthesize (`synthesis.voice_id`: a reference audio / saved voice) and how to encode it."""

    synthesis: SynthesisRequest
    surface: str  # "pai" or "openai" (metrics)
    fmt: str = "wav"
    sample_rate: int = 24000
    bit_rate: int | None = None
    volume: float = 1.0


# the last few ms of audio are always held back until the next chunk or the end, so that the tail (the
# last piece) carries audio too: every PAI event with audio has speech_len > 0, even for wav and pcm
HOLD_SECONDS = 0.02


@dataclass
class Piece:
    data: bytes  # the next bytes of the encoded file
    seconds: float  # audio handed to the encoder for this piece (at the output rate)
    generate_time: float  # waiting for this piece's audio (for the first: queue + synthesis)
    elapsed: float  # since the request was received
    last: bool = False  # the encoder's tail; nothing follows
    taken: str = ""  # duplex: the normalized text the LM took since the previous piece
    # sentences that began or ended since the previous piece (before this piece's audio; an "end" after the
    # sentence's last audio, which may sit in an earlier piece): `FrontendService.stream`'s on_sentence
    marks: list[SentenceMark] = field(default_factory=list)


def _pieces(service: FrontendService, refs: ReferenceAudios, req: SpeechRequest,
            received: float, cancelled: threading.Event | None = None,
            text: queue.Queue | None = None) -> Iterator[Piece]:
    """The blocking pipeline; raises CosyError. Setting `cancelled` cancels the job at once. `text`: the
    pieces of a duplex request (`FrontendService.stream`)."""
    encoder = make_encoder(req.fmt, req.sample_rate, bit_rate=req.bit_rate, streaming=req.synthesis.stream)
    try:
        refs.get(req.synthesis.voice_id)  # 400/404 in the API's words
        taken: list[str] = []  # filled by the chunk reader (this thread), emptied into each piece
        marks: list[SentenceMark] = []  # likewise
        chunks = service.stream(req.synthesis, req.surface, received, cancelled, text,
                                taken.append if text is not None else None, on_sentence=marks.append)
        out = OutputAudio(service.sample_rate, req.sample_rate, req.volume)
        hold, held = max(1, round(HOLD_SECONDS * req.sample_rate)), np.zeros(0, np.float32)
        try:
            t = time.monotonic()
            for chunk in chunks:
                now = time.monotonic()
                audio = np.concatenate([held, out.push(chunk)])
                cut = max(0, len(audio) - hold)
                audio, held = audio[:cut], audio[cut:]
                data = encoder.encode(audio)
                yield Piece(data, len(audio) / req.sample_rate, now - t, now - received, taken="".join(taken),
                            marks=marks[:])
                taken.clear()
                marks.clear()
                t = time.monotonic()
        finally:
            chunks.close()  # cancels the job if we stopped early
        audio = np.concatenate([held, out.finish()])
        tail = encoder.encode(audio) + encoder.finish()
        yield Piece(tail, len(audio) / req.sample_rate, 0.0, time.monotonic() - received, last=True,
                    taken="".join(taken), marks=marks[:])
    finally:
        encoder.close()


async def _in_thread(make: Callable[[threading.Event], Iterator]) -> AsyncIterator:
    """Iterate a blocking iterator in a dedicated thread; closing this sets the event `make` was given
    (which cancels the job behind the iterator) and stops the thread after its current item."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    stop = threading.Event()

    def put(item: tuple) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is gone (shutdown)
            stop.set()

    def run() -> None:
        it = None
        try:
            it = make(stop)
            for item in it:
                if stop.is_set():
                    break
                put(("item", item))
            put(("end", None))
        except BaseException as e:  # handed to the awaiting side
            put(("error", e))
        finally:
            if it is not None and hasattr(it, "close"):
                it.close()

    threading.Thread(target=run, daemon=True, name="speech").start()
    try:
        while True:
            kind, value = await queue.get()
            if kind == "item":
                yield value
            elif kind == "error":
                raise value
            else:
                return
    finally:
        stop.set()


async def open_speech(service: FrontendService, refs: ReferenceAudios, req: SpeechRequest,
                      received: float, request=None) -> AsyncIterator[Piece]:
    """Start a request and wait for its first piece (CosyError before any audio); then iterate them all.
    The service records the synthesis metrics. With `request` (Starlette's), a client that disconnects
    while this waits (queued, or in the LM) cancels the job at once (`ClientGone`)."""
    pieces = _in_thread(lambda stop: _pieces(service, refs, req, received, stop))
    try:
        first = await until_disconnected(request, pieces.__anext__())
    except BaseException:
        await pieces.aclose()
        raise

    async def all_pieces() -> AsyncIterator[Piece]:
        try:
            piece = first
            while True:
                yield piece
                if piece.last:
                    return
                # watched here too: a body that waits for its next piece notices a client that left
                piece = await until_disconnected(request, pieces.__anext__())
        finally:
            await pieces.aclose()

    return all_pieces()


class ClientGone(CosyError):
    """The client disconnected before its answer was ready; its job was cancelled (499, as nginx logs it)."""

    status = 499


async def _disconnected(request) -> None:
    """Returns when the client of `request` (a Starlette Request whose body was read) has disconnected."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnected(request, awaitable):
    """Await `awaitable`, unless the client disconnects first: then it is cancelled (closing the pieces
    cancels the job, queued or running) and `ClientGone` is raised. Without a request: just await it."""
    if request is None:
        return await awaitable
    work = asyncio.ensure_future(awaitable)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            return work.result()
        work.cancel()
        try:
            await work
        except BaseException:
            pass
        raise ClientGone("the client disconnected; its request was cancelled")
    finally:
        watch.cancel()
        if not work.done():  # we were cancelled (Starlette saw the client leave): let the work unwind
            work.cancel()  # now, so the generator it drives is closed before the caller closes it again
            while not work.done():
                try:
                    await asyncio.wait({work})
                except asyncio.CancelledError:  # re-delivered by the cancel scope; ours propagates after
                    pass
