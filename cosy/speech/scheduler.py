"""The speech-stage scheduler: flow/HiFT work items of many live requests, run one at a time by priority.

Each live request runs on its own thread (its LM token stream is consumed there: a remote backend's
client or the embedded LM, which releases the GIL in torch ops), so the LM of every request advances at
once. When a request's flow/HiFT work becomes due (a streaming chunk or a whole utterance), its thread
hands the work to `run` and waits; one runner thread executes the items with all the cores, so requests
never fight over them. Policy: first chunks before later ones (they decide first-packet latency),
otherwise oldest request first; an item that has waited `starve_after` seconds counts as a first chunk,
so no request starves. A cancelled request's queued items are skipped; a failing item fails only its own
request (the exception is re-raised in that request's thread).
"""
from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cosy.errors import Cancelled
from cosy.speech.request import LiveRequest


@dataclass
class WorkItem:
    request: LiveRequest
    fn: Callable[[], Any]
    first: bool
    seq: int
    queued: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None

    def key(self, now: float, starve_after: float) -> tuple:
        urgent = self.first or now - self.queued >= starve_after
        return (not urgent, self.request.arrival, self.seq)


class SpeechScheduler:
    def __init__(self, starve_after: float = 2.0):
        self.starve_after = starve_after
        self._items: list[WorkItem] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._local = threading.local()
        self._closed = False
        self.ran = 0
        threading.Thread(target=self._loop, daemon=True, name="speech-runner").start()

    def bind(self, request: LiveRequest) -> None:
        """The request the calling thread works for (its work items carry its priority)."""
        self._local.request = request

    def run(self, first: bool, fn: Callable[[], Any]) -> Any:
        """Queue `fn` for the calling thread's request and wait for its result (Cancelled if cancelled)."""
        request = getattr(self._local, "request", None)
        if request is None:  # a thread that is not a live request: run inline
            return fn()
        if request.cancelled.is_set():
            raise Cancelled()
        item = WorkItem(request, fn, first, next(self._seq))
        with self._cond:
            self._items.append(item)
            self._cond.notify()
        item.done.wait()
        if item.error is not None:
            raise item.error
        request.chunks += 1
        return item.result

    def pending(self) -> int:
        with self._cond:
            return len(self._items)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _next(self) -> WorkItem | None:
        with self._cond:
            while not self._items and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            now = time.monotonic()
            item = min(self._items, key=lambda i: i.key(now, self.starve_after))
            self._items.remove(item)
            return item

    def _loop(self) -> None:
        while (item := self._next()) is not None:
            try:
                if item.request.cancelled.is_set():
                    raise Cancelled()
                item.result = item.fn()
            except BaseException as e:  # handed to the request's own thread
                item.error = e
            self.ran += 1
            item.done.set()
