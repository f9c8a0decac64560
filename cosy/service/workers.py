"""Synthesis worker processes behind one queue, shared by the WebUI and every API of a frontend.

Each worker process holds its own `Engine` (text frontend, prompt encoder, flow, HiFT, and the embedded
LM or a client of the LM backends) and serves up to `max_batch` requests at once (`cosy.speech`; 1 keeps
the one-request-at-a-time loop), so `--workers N` serves N x max_batch requests. Jobs wait in one
`JobQueue` (`cosy.service.job_queue`: by priority class, then arrival, with aging; bounded per class, so
`submit` refuses at once with `QueueFull`, which the HTTP layer answers 429 with Retry-After, instead of
letting callers hang; a slot kept for interactive jobs): a worker with a free slot takes the most urgent job,
and nothing running is ever preempted. With `priorities` off every job is of one class: one FIFO queue, no
slot kept, the LM requests without priorities. A caller that
goes away cancels its job wherever it is: a waiting job leaves the queue at once (it no longer counts in
`waiting`), a running one stops at its next LM token (a remote LM request is aborted); at max_batch 1
also inside flow/HiFT, within one tensor operation: the worker learns it through a shared event (seen
between tokens and chunks) and a signal (SIGUSR1) that interrupts the engine's computation. At max_batch
> 1 the speech scheduler (`cosy.speech`) frees the slot at once and skips the request's queued work. A
worker that has not ended its cancelled jobs after `cancel_grace` s (all it holds are cancelled: nobody
waits for it) is stuck: its stacks go to its stderr, and it is killed and restarted.
"""
from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np

from cosy.deploy.cpus import sleep_idle_threads, spawn_environment, worker_thread_env, worker_threads
from cosy.deploy.hosts import all_on_this_machine
from cosy.errors import Cancelled, JobError, Unavailable
from cosy.pipeline.request import PRIORITIES, PRIORITY_AGING, SynthesisRequest, priority_rank
from cosy.pipeline.timing import SentenceMark
from cosy.prompt.encoder import PromptFeatures
from cosy.service.job_queue import Job, JobQueue, JobTrace
from cosy.service.placement import device_of_worker
from cosy.service.process import DUMP, INTERRUPT, EngineSpec, worker_main

log = logging.getLogger(__name__)


# seconds a worker gets to end its cancelled jobs (a remote LM may wait out --llm_queue_timeout, 60 s,
# before it sees the cancel) before it counts as stuck and is killed and restarted
CANCEL_GRACE = 90.0
SHUTTING_DOWN = ("ShuttingDown", "the server is shutting down; retry", 503, None)  # a job's error tuple


class ShuttingDown(Unavailable):
    def __init__(self):
        super().__init__(SHUTTING_DOWN[1], retry_after=1.0)


class WorkerPool:
    def __init__(self, spec: EngineSpec, workers: int = 1, max_queue: int = 64, start_timeout: float = 900,
                 priorities: bool = True, aging: float = PRIORITY_AGING):
        """`priorities`: serve by class (see the module doc), else one FIFO queue; `aging`: seconds a waiting
        job takes to move up one class."""
        if workers < 1 or spec.max_batch < 1:
            raise ValueError("workers and max_batch must be >= 1")
        if aging <= 0:
            raise ValueError("aging must be > 0 seconds")
        self.spec, self.n_workers = spec, workers
        self.priorities, self.aging = priorities, aging
        self.max_batch = spec.max_batch  # jobs one worker process holds at once
        self.start_timeout = start_timeout
        self.sample_rate = 24000
        self._waiting = JobQueue(max_queue, aging, spec.max_batch, keep_interactive_slot=priorities)  # under _ready
        self._ready = threading.Condition()
        self._ids = itertools.count(1)
        self._busy = 0
        self._lock = threading.Lock()
        self._job_seconds = 5.0  # running estimate for Retry-After
        self._threads: list[threading.Thread] = []
        self._procs: list[mp.Process] = []
        self._conns: list = []
        self._proc_of: dict = {}  # worker pipe -> its process (to interrupt, dump or kill it)
        self._closing = False
        self._draining = False
        self._live: dict[int, Job] = {}  # jobs a worker holds now (guarded by _lock): what drain() ends
        self._ctx = mp.get_context("spawn")
        urls = [u for u in (spec.llm_base_url or "").split(",") if u.strip()]
        # dead-until (time.monotonic(), system-wide) per LM backend, shared by every worker's BackendPool
        # and this process's /ready, so that both agree on which backends are usable
        self.backend_health = self._ctx.Array("d", len(urls)) if urls else None
        self.worker_prepare = None  # picklable callable(engine) run in each worker after it is built
        self.cancel_grace = CANCEL_GRACE

    @property
    def max_queue(self) -> int:
        """How many jobs of a class, or of a more urgent one, may wait (the queue's bound; may be changed)."""
        return self._waiting.max_queue

    @max_queue.setter
    def max_queue(self, n: int) -> None:
        with self._ready:
            self._waiting.max_queue = n

    def start(self) -> "WorkerPool":
        """Start every worker and wait until each has loaded its models; RuntimeError if one fails."""
        ctx = self._ctx
        if self.lm_shares_the_cores():
            sleep_idle_threads(os.environ)  # what a spawned worker's OpenMP reads as it loads torch
        conns = []
        for i in range(self.n_workers):
            conns.append(self._spawn(ctx, i))
        for i, (conn, cancel) in enumerate(conns):
            t = threading.Thread(target=self._dispatch, args=(i, conn, cancel, ctx), daemon=True, name=f"worker-{i}")
            self._threads.append(t)
            t.start()
        return self

    def lm_shares_the_cores(self) -> bool:
        """Whether an LM computes on the workers' cores: embedded (in each worker, beside the flow's thread
        pool), or on backends of this machine (every --llm_base_url host on the loopback, or
        `--llm_split_first_chunk on`, which says so where a host name cannot: compose on one machine). Then
        the workers' idle OpenMP threads sleep instead of spinning on cores the LM needs; a frontend whose
        backends run elsewhere keeps its cores to its flow and HiFT."""
        urls = self.spec.llm_base_url or ""
        return not urls.strip() or all_on_this_machine(urls) or self.spec.llm_split_first_chunk == "on"

    def worker_spec(self, index: int) -> EngineSpec:
        """Worker `index`'s spec: its device from the pool's list (round-robin), its share of the cores."""
        spec = self.spec
        threads = spec.threads or worker_threads(self.n_workers)  # a share of OMP_NUM_THREADS, or of the cores
        return EngineSpec(**{**vars(spec), "threads": threads, "device": device_of_worker(spec.device, index),
                             "priority_aging": self.aging})  # the flow scheduler's aging is the queue's

    def _spawn(self, ctx, index: int):
        parent, child = ctx.Pipe()
        cancel = ctx.Event()
        spec = self.worker_spec(index)
        proc = ctx.Process(target=worker_main, args=(spec, child, cancel, self.backend_health, self.worker_prepare),
                           daemon=True)
        with spawn_environment(worker_thread_env(spec.threads, self.n_workers)):
            proc.start()
        child.close()
        if not parent.poll(self.start_timeout):
            raise RuntimeError("a synthesis worker did not start in time")
        try:
            status, info = parent.recv()
        except EOFError:
            raise RuntimeError("a synthesis worker exited while starting") from None
        if status != "ready":
            raise RuntimeError(f"a synthesis worker failed to start: {info}")
        self.sample_rate = info
        self._procs.append(proc)
        self._conns.append(parent)
        self._proc_of[parent] = proc
        return parent, cancel

    def _dispatch(self, index: int, conn, cancel, ctx) -> None:
        """One thread per worker: keep it fed with up to max_batch of the oldest waiting jobs, relay their
        messages back by job id, forward cancels."""
        live: dict[int, tuple[Job, float]] = {}
        cancel_sent: dict[int, float] = {}  # job id -> when its cancel went to the worker
        while True:
            new = []
            with self._ready:
                while not live and not self._waiting and not self._closing:
                    self._ready.wait()
                if self._closing:
                    return
                while len(live) + len(new) < self.max_batch and (job := self._waiting.take(len(live) + len(new))):
                    new.append(job)
                with self._lock:  # counted busy before it stops counting as waiting: no gap in the metrics
                    self._busy += len(new)
            try:
                for job in new:
                    live[job.id] = (job, time.monotonic())
                    job.trace.queue_wait = live[job.id][1] - job.submitted
                    with self._lock:
                        self._live[job.id] = job
                    cancel.clear()  # max_batch 1: the event speaks of the one running job
                    conn.send((job.id, job.kind, job.payload))
                for job_id, (job, _) in live.items():
                    while job.text is not None and job_id not in cancel_sent and not job.text.empty():
                        conn.send(("text", job_id, job.text.get_nowait()))
                    if job.cancelled.is_set() and job_id not in cancel_sent:
                        if self.max_batch == 1:
                            cancel.set()  # seen by the worker inside the LM, between tokens
                            self._interrupt(conn, job)
                        conn.send(("cancel", job_id))
                        cancel_sent[job_id] = time.monotonic()
                if cancel_sent and len(cancel_sent) == len(live) and \
                        time.monotonic() - min(cancel_sent.values()) > self.cancel_grace:
                    self._kill_stuck(index, conn, sorted(cancel_sent))
                    raise EOFError("killed")  # as if it had crashed: restarted below
                if not conn.poll(0.02):
                    continue
                kind, job_id, data = conn.recv()
                if job_id not in live:
                    continue
                job = live[job_id][0]
                if kind == "done" and isinstance(data, dict):  # what the worker measured of the job
                    job.trace.backend_seconds = data.get("backend_seconds")
                if job_id not in cancel_sent or kind in ("done", "error"):  # nobody reads chunks after a cancel
                    job.out.put((kind, data))
                if kind in ("done", "error"):
                    self._finished(live.pop(job_id)[1], job_id)
                    cancel_sent.pop(job_id, None)
            except Exception as e:  # the worker died, or its pipe can no longer be trusted
                if not isinstance(e, (EOFError, OSError)):
                    log.exception("worker %d: its messages could not be read; restarting it", index)
                    self._kill(conn)
                for job_id, (job, started) in live.items():
                    job.out.put(("error", ("WorkerCrashed", "the synthesis worker stopped unexpectedly; retry",
                                           503, None)))
                    self._finished(started, job_id)
                live.clear()
                cancel_sent.clear()
                if self._closing:
                    return
                log.error("worker %d died; restarting it", index)
                try:
                    conn, cancel = self._spawn(ctx, index)
                except RuntimeError:
                    log.exception("worker %d could not be restarted", index)
                    return

    def _kill_stuck(self, index: int, conn, jobs: list[int]) -> None:
        """A worker whose every job is cancelled has not ended them in `cancel_grace` s: it is stuck
        (nobody waits for its output). Its stacks go to its stderr (SIGUSR2), then it is killed; the
        dispatcher restarts it as after a crash."""
        log.error("worker %d has not stopped its cancelled jobs %s in %.0f s: it is stuck; its stacks follow "
                  "on stderr, then it is restarted", index, jobs, self.cancel_grace)
        if DUMP is not None and conn in self._proc_of:
            try:
                os.kill(self._proc_of[conn].pid, DUMP)
                time.sleep(1.0)  # the dump is written by the worker's own signal handler
            except OSError:
                pass
        self._kill(conn)

    def _kill(self, conn) -> None:
        """SIGKILL the worker at the end of `conn`, and reap it."""
        proc = self._proc_of.get(conn)
        if proc is not None:
            proc.kill()
            proc.join(timeout=10)

    def _interrupt(self, conn, job: Job) -> None:
        """Stop a max_batch-1 worker's flow/HiFT computation now (see _Interrupt)."""
        if INTERRUPT is not None and job.kind in ("synthesize", "duplex") and conn in self._proc_of:
            try:
                os.kill(self._proc_of[conn].pid, INTERRUPT)
            except OSError:
                pass

    def _finished(self, started: float, job_id: int) -> None:
        with self._lock:
            self._live.pop(job_id, None)
            self._busy -= 1
            self._job_seconds = 0.8 * self._job_seconds + 0.2 * (time.monotonic() - started)

    def submit(self, kind: str, payload: dict, cancelled: threading.Event | None = None,
               text: queue.Queue | None = None, trace: JobTrace | None = None) -> Job:
        """Queue a job; QueueFull at once when `max_queue` jobs of its class or a more urgent one already
        wait (its class: `payload["priority"]`, default when absent). `cancelled`: the caller's own event (set
        it to cancel the job; `cancel(job)` does that and frees the queue place at once); `trace`: filled
        with what the pool learns of the job (`JobTrace`)."""
        if not self.priorities and payload.get("priority") is not None:  # one class: the workers' and the LM's too
            payload = {**payload, "priority": None}
        rank = priority_rank(payload.get("priority"))
        job = Job(next(self._ids), kind, payload, text=text, rank=rank, trace=trace or JobTrace())
        if cancelled is not None:
            job.cancelled = cancelled
        with self._ready:
            if self._draining or self._closing:
                raise ShuttingDown()
            self._waiting.add(job, self._job_seconds / (self.n_workers * self.max_batch))
            self._ready.notify()
        return job

    def cancel(self, job: Job) -> None:
        """The caller went away: a waiting job leaves the queue now, a running one is stopped by its worker."""
        job.cancelled.set()
        with self._ready:
            self._waiting.remove(job)

    def _results(self, job: Job) -> Iterator[tuple[str, object]]:
        finished = False
        try:
            while True:
                try:
                    kind, data = job.out.get(timeout=0.1)
                except queue.Empty:
                    if job.cancelled.is_set():  # cancelled by its caller (from another thread)
                        raise Cancelled("the request was cancelled") from None
                    continue
                if kind in ("done", "error"):
                    finished = True
                if kind == "error":
                    raise JobError(*data)
                if kind == "done":
                    return
                yield kind, data
        finally:
            if not finished:  # the caller went away: out of the queue now, or stopped by its worker
                self.cancel(job)

    def synthesize(self, request: SynthesisRequest, cancelled: threading.Event | None = None,
                   trace: JobTrace | None = None,
                   on_mark: Callable[[SentenceMark], None] | None = None) -> Iterator[np.ndarray]:
        """Queue a synthesis (by `request.priority`); yield (N,) float32 chunks at `sample_rate` (QueueFull at
        once when full). Closing the iterator, or setting `cancelled`, cancels the job (`Cancelled` is raised
        to a reader). `trace`: filled as the job goes (`JobTrace`). `on_mark` gets each sentence mark in order
        with the chunks, called by this reader (`_chunks`)."""
        job = self.submit("synthesize", request.to_wire(), cancelled, trace=trace)
        yield from self._chunks(job, on_mark)

    def synthesize_duplex(self, request: SynthesisRequest, text: queue.Queue,
                          cancelled: threading.Event | None = None,
                          on_text: Callable[[str], None] | None = None,
                          trace: JobTrace | None = None,
                          on_mark: Callable[[SentenceMark], None] | None = None) -> Iterator[np.ndarray]:
        """`synthesize` of a duplex request (`request.duplex`): the caller puts text pieces (str) into
        `text` while audio comes out, then None to end the text (`Engine.synthesize_duplex` in a worker).
        `on_text` gets each normalized piece the LM takes, `on_mark` each sentence mark, in order with the
        chunks (called by this reader)."""
        job = self.submit("duplex", request.to_wire(), cancelled, text, trace)
        yield from self._chunks(job, on_mark, on_text)

    def _chunks(self, job: Job, on_mark: Callable[[SentenceMark], None] | None = None,
                on_text: Callable[[str], None] | None = None) -> Iterator[np.ndarray]:
        """A synthesis job's audio chunks; its other messages go to their callbacks as they come, in order
        with the chunks: a sentence's "begin" mark before its first chunk is yielded, its "end" mark after
        its last one is (before the next chunk is yielded, or the iterator ends)."""
        for kind, data in self._results(job):
            if kind == "chunk":
                yield data
            elif kind == "mark":
                if on_mark is not None:
                    on_mark(SentenceMark.from_wire(data))
            elif kind == "taken" and on_text is not None:
                on_text(data)

    def prompt_features(self, source: str, cancelled: threading.Event | None = None) -> PromptFeatures:
        """Prompt audio file -> PromptFeatures, computed in a worker (the ONNX models live there)."""
        for _, arrays in self._results(self.submit("features", {"source": str(source)}, cancelled)):
            return PromptFeatures.from_arrays(arrays)
        raise JobError("WorkerCrashed", "no result", 503)

    def alive(self) -> bool:
        """Every worker process is running (a crashed one is restarted with its next job)."""
        return bool(self._procs) and all(p.is_alive() for p in self._procs[-self.n_workers:])

    def stats(self) -> dict:
        """workers, busy (jobs running), waiting (and `waiting_by_priority`: by class), max_batch, capacity."""
        with self._ready:
            ranks = self._waiting.ranks()
            with self._lock:
                busy = self._busy
        return {"workers": self.n_workers, "busy": busy, "waiting": len(ranks), "max_batch": self.max_batch,
                "capacity": self.n_workers * self.max_batch,
                "waiting_by_priority": {name: ranks.count(i) for i, name in enumerate(PRIORITIES)}}

    @property
    def draining(self) -> bool:
        return self._draining

    def drain(self, timeout: float) -> int:
        """Stop for a clean shutdown: new jobs are refused (`ShuttingDown`, 503), waiting ones end with that
        error now (another frontend can take them), running ones get `timeout` s to finish; those still
        running then end with it too (a stream's reader sends it as its error event). Returns how many
        running jobs were ended so."""
        with self._ready:
            self._draining = True
            waiting = self._waiting.take_all()
        for job in waiting:
            job.out.put(("error", SHUTTING_DOWN))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._live:
                    return 0
            time.sleep(0.1)
        with self._lock:
            cut = list(self._live.values())
        for job in cut:
            job.out.put(("error", SHUTTING_DOWN))
        return len(cut)

    def close(self, grace: float = 3.0) -> None:
        """Stop the workers: ask each to exit (closing its pipe), terminate those still running after
        `grace` s, kill the rest. Waiting jobs end with an error. Safe to call twice."""
        with self._ready:
            if self._closing and not self._procs:
                return
            self._closing = True
            waiting = self._waiting.take_all()
            self._ready.notify_all()
        for job in waiting:
            job.out.put(("error", SHUTTING_DOWN))
        for conn in self._conns:
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + grace
        for p in self._procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self._procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join(timeout=2)
        for t in self._threads:
            t.join(timeout=1)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns, self._proc_of = [], [], {}
