"""The speech-stage scheduler: flow/HiFT work items of many live requests, run one at a time by priority.

Each live request runs on its own thread (its LM token stream is consumed there: a remote backend's
client or the embedded LM, which releases the GIL in torch ops), so the LM of every request advances at
once. When a request's flow/HiFT work becomes due (a streaming chunk or a whole utterance), its thread
hands the work to `run` and waits; one runner thread executes the items with all the cores, so requests
never fight over them. Policy: the request's priority class first (`cosy.pipeline.request.PRIORITIES`: a
listener's stream is not held up by bulk work), then first chunks before later ones (they decide
first-packet latency), otherwise oldest request first. An item moves up one class for every `aging` seconds
it waits (the worker queue's rule, `aged_rank`), and one that has waited `starve_after` seconds counts as a
first chunk, so no request starves. While a listener (a streaming request; a duplex session once its first text
has come) waits for its first packet, work of a less urgent class is not started (for at most `hold_first` s per
listener): the cores go to that listener's LM
(the backend, or the embedded LM) instead of bulk flows, and each of the items its first packet needs (the first
chunk's prompt part computed ahead, the chunk's flow, its vocoder step: queued one after the other by its
thread) finds the runner free. The hold ends when the worker sends the first chunk (`heard`); the held work runs
right after. Work already running yields too: at each of its preemption points (between two ODE steps of a
flow, before a vocoder pass: `cosy.preemption`) the queued items of a more urgent class run first, and it pauses
while such a listener waits for its first packet, so a listener arriving during a bulk utterance waits one
step, not the utterance (bench/priority.py measures both sides). A cancelled request's queued
items are skipped; a failing item fails only its own request (the exception is re-raised in that request's
thread).

Batching: an item may carry a `Batch` (a batch function and this item's argument, with its cost in
frames): whole-utterance and final-chunk flows (`Token2Wav.run_jobs`, one padded batch), streaming chunks'
incremental flows (`Token2Wav.run_chunks`, rows at the same place batched) and CosyVoice2's streaming HiFT
steps (`Token2Wav.run_vocode`, rows of equal shape batched). The runner takes the most urgent item and,
when it is batchable, adds the next most urgent queued items with the same batch function (same policy
order) while the batch stays within `max_frames` (rows x largest cost) and `max_rows`; the batch function
runs them as one step. A result that is an exception fails its own item only; if the step itself raises
(it must then have changed nothing), each item of the batch is rerun alone, so a failing request fails
alone and its companions get their solo results.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cosy.errors import Cancelled
from cosy.pipeline.request import PRIORITY_AGING, aged_rank, priority_rank
from cosy.preemption import preemptible
from cosy.speech.request import LiveRequest


@dataclass
class Batch:
    """How an item runs together with others: `fn([arg, ...]) -> [result, ...]` in order; `frames` its cost."""

    fn: Callable[[list[Any]], list[Any]]
    arg: Any
    frames: int


@dataclass
class WorkItem:
    request: LiveRequest
    fn: Callable[[], Any]
    first: bool
    seq: int
    batch: Batch | None = None
    queued: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None

    def key(self, now: float, starve_after: float, aging: float = PRIORITY_AGING) -> tuple:
        waited = now - self.queued
        rank = aged_rank(priority_rank(self.request.payload.get("priority")), waited, aging)
        return (rank, not (self.first or waited >= starve_after), self.request.arrival, self.seq)


RECENT_BATCHES = 1000
HOLD_FIRST = 3.0  # s a listener waiting for its first packet holds back less urgent work, at most


class SpeechScheduler:
    def __init__(self, starve_after: float = 2.0, max_frames: int = 4096, max_rows: int = 1,
                 aging: float = PRIORITY_AGING, hold_first: float = HOLD_FIRST):
        # max_rows: `--flow_batch` (1 = no batching, the CPU default: there a batch row costs as much as a
        # solo run, see bench/flow_batch.py). Batched flows equal solo to ~1e-6 on the mel.
        self.starve_after, self.aging, self.hold_first = starve_after, aging, hold_first
        self._listeners: dict[int, LiveRequest] = {}  # bound streaming requests that may still await a first packet
        self.max_frames, self.max_rows = max_frames, max_rows
        # (batch function, rows) of the last RECENT_BATCHES batched steps: bounded, a process runs millions
        self.batches: deque[tuple[str, int]] = deque(maxlen=RECENT_BATCHES)
        self._items: list[WorkItem] = []
        self._cond = threading.Condition()
        self._seq = itertools.count()
        self._local = threading.local()
        self._closed = False
        self.ran = 0
        self._thread = threading.Thread(target=self._loop, daemon=True, name="speech-runner")
        self._thread.start()

    def bind(self, request: LiveRequest) -> None:
        """The request the calling thread works for (its work items carry its priority)."""
        self._local.request = request
        if request.kind == "duplex" or request.payload.get("stream"):
            with self._cond:
                self._listeners[id(request)] = request

    def run(self, first: bool, fn: Callable[[], Any], batch: Batch | None = None) -> Any:
        """Queue `fn` for the calling thread's request and wait for its result (Cancelled if cancelled).

        With `batch`, the runner may compute it together with other requests' items (`batch.fn`); the
        result equals `fn()`'s to float rounding."""
        request = getattr(self._local, "request", None)
        if request is None:  # a thread that is not a live request: run inline
            return fn()
        if request.cancelled.is_set():
            raise Cancelled()
        item = WorkItem(request, fn, first, next(self._seq), batch)
        with self._cond:
            self._items.append(item)
            self._cond.notify()
        item.done.wait()
        if item.error is not None:
            raise item.error
        return item.result

    def heard(self, request: LiveRequest) -> None:
        """The request's first audio chunk was sent: a listener's hold on less urgent work ends."""
        with self._cond:
            request.heard = True
            self._cond.notify_all()

    def pending(self) -> int:
        with self._cond:
            return len(self._items)

    def close(self, timeout: float = 10.0) -> None:
        """Stop the runner: queued work ends Cancelled, and the runner is waited for (`timeout` s), so no
        thread of ours frees tensors while the interpreter finalizes (torch's C++ then aborts the process:
        "terminate called without an active exception")."""
        with self._cond:
            self._closed = True
            queued, self._items = self._items, []
            self._cond.notify_all()
        for item in queued:
            item.error = Cancelled()
            item.done.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _held_above(self, now: float) -> tuple[int | None, float]:
        """(the most urgent class of a listener still waiting for its first packet with no item queued, None
        when there is none; s until the earliest of their holds ends). A duplex session's hold starts with its first
        text piece: one that sends no text holds nothing. Forgets listeners that were heard, ended, were cancelled
        or waited `hold_first` s."""
        rank, until = None, self.hold_first
        queued = {id(i.request) for i in self._items}
        for key, r in list(self._listeners.items()):
            if r.heard or r.cancelled.is_set() or r._ended:
                del self._listeners[key]
                continue
            since = r.first_text if r.kind == "duplex" else r.arrival
            if since is None:  # a duplex session without text yet: nothing to hold for
                continue
            left = since + self.hold_first - now
            if left <= 0:
                del self._listeners[key]
                continue
            if key in queued:  # its queued item ranks by class
                continue
            mine = priority_rank(r.payload.get("priority"))
            rank = mine if rank is None else min(rank, mine)
            until = min(until, left)
        return rank, until

    def _next(self) -> list[WorkItem] | None:
        with self._cond:
            while True:
                while not self._items and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return None
                now = time.monotonic()
                ranked = sorted(self._items, key=lambda i: i.key(now, self.starve_after, self.aging))
                held, until = self._held_above(now)
                if held is None or ranked[0].key(now, self.starve_after, self.aging)[0] <= held:
                    return self._take(ranked)
                self._cond.wait(min(until, 0.05))  # (a listener's cancel does not notify: look again soon)

    def _take(self, ranked: list[WorkItem]) -> list[WorkItem]:
        """The head of `ranked` and, when it is batchable, the next items it batches with; out of the queue.
        Called with `_cond` held."""
        head = ranked[0]
        picked = [head]
        if head.batch is not None:
            longest = head.batch.frames
            for other in ranked[1:]:
                if len(picked) >= self.max_rows:
                    break
                b = other.batch
                if b is None or b.fn != head.batch.fn or other.request.cancelled.is_set():
                    continue
                if (len(picked) + 1) * max(longest, b.frames) > self.max_frames:
                    continue
                picked.append(other)
                longest = max(longest, b.frames)
        for item in picked:
            self._items.remove(item)
        return picked

    def _yield_to_urgent(self, running: list[WorkItem]) -> None:
        """At a preemption point of `running` (`cosy.preemption`): run the queued items of a more urgent class
        first, and pause while a listener of a more urgent class waits for its first packet with nothing
        queued (its LM gets the cores; at most `hold_first`). Classes are aged as in `_next`: a paused bulk
        utterance moves up as it waits, so it is not starved. Cancelled when every running item's request
        is cancelled: a cancelled utterance stops at its next step."""
        while True:
            if self._closed or all(i.request.cancelled.is_set() for i in running):
                raise Cancelled()
            with self._cond:
                now = time.monotonic()
                mine = min(i.key(now, self.starve_after, self.aging)[0] for i in running)
                urgent = sorted((i for i in self._items if i.key(now, self.starve_after, self.aging)[0] < mine),
                                key=lambda i: i.key(now, self.starve_after, self.aging))
                if not urgent:
                    held, until = self._held_above(now)
                    if held is None or held >= mine:
                        return
                    self._cond.wait(min(until, 0.05))
                    continue
                picked = self._take(urgent)
            self._execute(picked)

    @staticmethod
    def _run_one(item: WorkItem) -> None:
        try:
            if item.request.cancelled.is_set():
                raise Cancelled()
            item.result = item.fn()
        except BaseException as e:  # handed to the request's own thread
            item.error = e

    def _execute(self, picked: list[WorkItem]) -> None:
        """Run `picked` (one item, or a batch of them) and hand each its result or error."""
        live = [i for i in picked if not i.request.cancelled.is_set()]
        if len(live) > 1:
            try:
                results = live[0].batch.fn([i.batch.arg for i in live])
                if len(results) != len(live):
                    raise RuntimeError("batch function returned the wrong number of results")
            except BaseException:  # someone in the batch failed: everyone runs alone
                for item in live:
                    self._run_one(item)
            else:
                for item, result in zip(live, results):
                    if isinstance(result, BaseException):
                        item.error = result
                    else:
                        item.result = result
                self.batches.append((getattr(live[0].batch.fn, "__name__", "?"), len(live)))
            for item in picked:
                if item not in live:
                    item.error = Cancelled()
        else:
            for item in picked:
                self._run_one(item)
        self.ran += len(picked)
        for item in picked:
            item.done.set()

    def _loop(self) -> None:
        while (picked := self._next()) is not None:
            with preemptible(lambda: self._yield_to_urgent(picked)):
                self._execute(picked)
