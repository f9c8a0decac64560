"""The jobs of a worker pool and the queue where they wait for a worker's slot.

Served by priority class (`cosy.pipeline.request.PRIORITIES`: interactive, default, bulk), then by arrival;
a waiting job moves up one class for every `aging` seconds it has waited, so bulk work is never starved.
`add` refuses at once with `QueueFull` when `max_queue` jobs of the new one's class or a more urgent one wait:
bulk work that fills the queue never locks a listener out. Once the queue has had an interactive job, a worker
of max_batch > 1 keeps its last slot for interactive jobs (`take`), so a listener's stream starts at once beside
a worker full of bulk work; a queue that only ever gets default or bulk work (a batch run's) uses every slot.
Not thread-safe by itself: the pool guards it with its condition.
"""
from __future__ import annotations

import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from cosy.errors import Busy
from cosy.pipeline.request import aged_rank


class QueueFull(Busy):
    def __init__(self, waiting: int, retry_after: float):
        super().__init__(f"the server is busy ({waiting} requests waiting); retry in {retry_after:.0f} s",
                         retry_after=retry_after)


@dataclass
class JobTrace:
    """What the pool learns of a job for its caller's metrics."""

    queue_wait: float | None = None  # s from `submit` until a worker took it
    backend_seconds: float | None = None  # s the worker waited for the LM backends' tokens (at its end)


@dataclass
class Job:
    id: int
    kind: str  # "synthesize" (payload: SynthesisRequest.to_wire()) or "features" (payload: {"source": path})
    payload: dict
    out: queue.Queue = field(default_factory=queue.Queue)  # ("chunk"|"mark"|"taken"|"result"|"done"|"error", data)
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.monotonic)
    text: queue.Queue | None = None  # "duplex": text pieces for the worker, None ends the text
    rank: int = 1  # its priority class (0 most urgent; `priority_rank`)
    trace: JobTrace = field(default_factory=JobTrace)

    def urgency(self, now: float, aging: float) -> tuple[float, float]:
        """Its place in the queue (lowest first): its class, one up for every `aging` s waited, then arrival."""
        return aged_rank(self.rank, now - self.submitted, aging), self.submitted


class JobQueue:
    def __init__(self, max_queue: int, aging: float, max_batch: int, keep_interactive_slot: bool = True):
        """`keep_interactive_slot`: False when every job is of one class (the pool's priorities off)."""
        self.max_queue, self.aging, self.max_batch = max_queue, aging, max_batch
        self.keep_interactive_slot = keep_interactive_slot
        self._jobs: deque[Job] = deque()
        self._interactive_seen = False  # then a worker's last slot is for interactive jobs (`take`)

    def __bool__(self) -> bool:
        return bool(self._jobs)

    def add(self, job: Job, seconds_per_slot: float) -> None:
        """Queue `job`; QueueFull when `max_queue` jobs of its class or a more urgent one wait (its Retry-After:
        the jobs ahead of it and itself, `seconds_per_slot` each)."""
        self._drop_cancelled()
        ahead = sum(j.rank <= job.rank for j in self._jobs)
        if ahead >= self.max_queue:
            raise QueueFull(ahead, seconds_per_slot * (ahead + 1))
        self._jobs.append(job)
        self._interactive_seen |= job.rank == 0 and self.keep_interactive_slot

    def take(self, held: int) -> Job | None:
        """The most urgent waiting job a worker holding `held` jobs may take (out of the queue), or None. The
        last of its max_batch slots is for interactive jobs only (their class, not aged into it)."""
        self._drop_cancelled()
        reserved = self._interactive_seen and self.max_batch > 1 and held >= self.max_batch - 1
        now = time.monotonic()
        fit = [j for j in self._jobs if not reserved or j.rank == 0]
        if not fit:
            return None
        job = min(fit, key=lambda j: j.urgency(now, self.aging))
        self._jobs.remove(job)
        return job

    def remove(self, job: Job) -> None:
        """Out of the queue, if it is there (its caller went away)."""
        try:
            self._jobs.remove(job)
        except ValueError:
            pass  # running or finished

    def take_all(self) -> list[Job]:
        """Every waiting job, out of the queue (a drain or close ends them)."""
        jobs, self._jobs = list(self._jobs), deque()
        return jobs

    def ranks(self) -> list[int]:
        """The class of each job waiting (cancelled ones not counted)."""
        return [j.rank for j in self._jobs if not j.cancelled.is_set()]

    def _drop_cancelled(self) -> None:
        self._jobs = deque(j for j in self._jobs if not j.cancelled.is_set())
