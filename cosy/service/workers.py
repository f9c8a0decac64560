"""Synthesis worker processes behind one fair queue, shared by the WebUI and every API of a frontend.

Each worker process holds its own `Engine` (text frontend, prompt encoder, flow, HiFT, and the embedded
LM or a client of the LM backends), so `--workers N` serves N requests at once. Jobs wait in one FIFO
queue; a free worker takes the oldest. Past `max_queue` waiting jobs, `submit` refuses at once with
`QueueFull` (the HTTP layer answers 429 with Retry-After) instead of letting callers hang. A caller that
goes away cancels its job; the worker stops after the current chunk (a remote LM request is aborted).
"""
from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from cosy.errors import Busy, JobError
from cosy.pipeline.request import SynthesisRequest
from cosy.prompt.encoder import PromptFeatures

log = logging.getLogger(__name__)


class QueueFull(Busy):
    def __init__(self, waiting: int, retry_after: float):
        super().__init__(f"the server is busy ({waiting} requests waiting); retry in {retry_after:.0f} s",
                         retry_after=retry_after)


@dataclass
class EngineSpec:
    """How a worker builds its Engine (picklable: it crosses into the worker process)."""

    model_dir: str
    device: str = "cpu"
    ttsfrd_dir: str | None = None
    llm_base_url: str | None = None
    llm_api_key: str | None = None
    threads: int | None = None
    max_batch: int = 1  # live requests per worker process (1: the old one-request-at-a-time loop)
    cache_mb: int = 0  # streaming flow state budget (cosy.speech.cache); 0 recomputes every prefix


@dataclass
class Job:
    id: int
    kind: str  # "synthesize" (payload: SynthesisRequest.to_wire()) or "features" (payload: {"source": path})
    payload: dict
    out: queue.Queue = field(default_factory=queue.Queue)  # ("chunk"|"result"|"done"|"error", data)
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.monotonic)


def _worker_main(spec: EngineSpec, conn, prepare=None) -> None:
    """Worker process: build the engine (`prepare(engine)` may adjust it: benchmarks fix the token count),
    then run its jobs: one at a time (max_batch 1) or up to max_batch at once (`cosy.speech.worker`)."""
    import torch

    from cosy.pipeline.engine import Engine

    torch.set_num_threads(spec.threads or max(1, (os.cpu_count() or 1)))
    try:
        engine = Engine.from_model_dir(spec.model_dir, device=spec.device, ttsfrd_dir=spec.ttsfrd_dir,
                                       llm_base_url=spec.llm_base_url, llm_api_key=spec.llm_api_key,
                                       cache_mb=spec.cache_mb)
    except Exception as e:  # reported to the parent, which refuses to start
        conn.send(("failed", f"{type(e).__name__}: {e}"))
        return
    if prepare is not None:
        prepare(engine)
    conn.send(("ready", engine.sample_rate))
    if spec.max_batch > 1:  # many live requests, their flow/HiFT work scheduled (cosy.speech)
        from cosy.speech.worker import serve
        serve(engine, conn)
        return
    while (msg := conn.recv()) is not None:
        if msg[0] == "cancel":  # for a job that has finished meanwhile
            continue
        job_id, kind, payload = msg
        try:
            if kind == "features":
                conn.send(("result", job_id, engine.prompt_features(payload["source"]).to_arrays()))
            else:
                chunks = engine.synthesize(SynthesisRequest.from_wire(payload))
                for chunk in chunks:
                    conn.send(("chunk", job_id, chunk.numpy()))
                    if conn.poll() and conn.recv() == ("cancel", job_id):
                        chunks.close()
                        break
            conn.send(("done", job_id, None))
        except Exception as e:
            log.debug("job %s failed", job_id, exc_info=True)
            conn.send(("error", job_id, JobError.wire(e)))


class WorkerPool:
    def __init__(self, spec: EngineSpec, workers: int = 1, max_queue: int = 64, start_timeout: float = 900):
        if workers < 1 or spec.max_batch < 1:
            raise ValueError("workers and max_batch must be >= 1")
        self.spec, self.n_workers, self.max_queue = spec, workers, max_queue
        self.max_batch = spec.max_batch  # jobs one worker process holds at once
        self.start_timeout = start_timeout
        self.sample_rate = 24000
        self._waiting: deque[Job] = deque()  # guarded by _ready
        self._ready = threading.Condition()
        self._ids = itertools.count(1)
        self._busy = 0
        self._lock = threading.Lock()
        self._job_seconds = 5.0  # running estimate for Retry-After
        self._threads: list[threading.Thread] = []
        self._procs: list[mp.Process] = []
        self._closing = False
        self.worker_prepare = None  # picklable callable(engine) run in each worker after it is built

    def start(self) -> "WorkerPool":
        """Start every worker and wait until each has loaded its models; RuntimeError if one fails."""
        ctx = mp.get_context("spawn")
        conns = []
        for _ in range(self.n_workers):
            conns.append(self._spawn(ctx))
        for i, conn in enumerate(conns):
            t = threading.Thread(target=self._dispatch, args=(i, conn, ctx), daemon=True, name=f"worker-{i}")
            self._threads.append(t)
            t.start()
        return self

    def _spawn(self, ctx):
        parent, child = ctx.Pipe()
        spec = self.spec
        if spec.threads is None:  # share the cores between the workers
            spec = EngineSpec(**{**vars(spec), "threads": max(1, (os.cpu_count() or 1) // self.n_workers)})
        proc = ctx.Process(target=_worker_main, args=(spec, child, self.worker_prepare), daemon=True)
        proc.start()
        child.close()
        if not parent.poll(self.start_timeout):
            raise RuntimeError("a synthesis worker did not start in time")
        status, info = parent.recv()
        if status != "ready":
            raise RuntimeError(f"a synthesis worker failed to start: {info}")
        self.sample_rate = info
        self._procs.append(proc)
        return parent

    def _dispatch(self, index: int, conn, ctx) -> None:
        """One thread per worker: keep it fed with up to max_batch of the oldest waiting jobs, relay their
        messages back by job id, forward cancels."""
        live: dict[int, tuple[Job, float]] = {}
        cancel_sent: set[int] = set()
        while True:
            new = []
            with self._ready:
                while not live and not self._waiting and not self._closing:
                    self._ready.wait()
                if self._closing:
                    return
                while self._waiting and len(live) + len(new) < self.max_batch:
                    job = self._waiting.popleft()
                    if not job.cancelled.is_set():
                        new.append(job)
            try:
                for job in new:
                    with self._lock:
                        self._busy += 1
                    live[job.id] = (job, time.monotonic())
                    conn.send((job.id, job.kind, job.payload))
                for job_id, (job, _) in live.items():
                    if job.cancelled.is_set() and job_id not in cancel_sent:
                        conn.send(("cancel", job_id))
                        cancel_sent.add(job_id)
                if not conn.poll(0.02):
                    continue
                kind, job_id, data = conn.recv()
                if job_id not in live:
                    continue
                job = live[job_id][0]
                job.out.put((kind, data))
                if kind in ("done", "error"):
                    self._finished(live.pop(job_id)[1])
                    cancel_sent.discard(job_id)
            except (EOFError, OSError):
                for job, started in live.values():
                    job.out.put(("error", ("WorkerCrashed", "the synthesis worker stopped unexpectedly; retry",
                                           503, None)))
                    self._finished(started)
                live.clear()
                cancel_sent.clear()
                if self._closing:
                    return
                log.error("worker %d died; restarting it", index)
                conn = self._spawn(ctx)

    def _finished(self, started: float) -> None:
        with self._lock:
            self._busy -= 1
            self._job_seconds = 0.8 * self._job_seconds + 0.2 * (time.monotonic() - started)

    def submit(self, kind: str, payload: dict) -> Job:
        """Queue a job; QueueFull at once when `max_queue` jobs already wait."""
        job = Job(next(self._ids), kind, payload)
        with self._ready:
            live = [j for j in self._waiting if not j.cancelled.is_set()]
            self._waiting = deque(live)
            if len(live) >= self.max_queue:
                raise QueueFull(len(live), self._job_seconds * (len(live) + 1) / (self.n_workers * self.max_batch))
            self._waiting.append(job)
            self._ready.notify()
        return job

    def _results(self, job: Job) -> Iterator[tuple[str, object]]:
        try:
            while True:
                kind, data = job.out.get()
                if kind == "error":
                    raise JobError(*data)
                if kind == "done":
                    return
                yield kind, data
        finally:
            job.cancelled.set()  # no-op when finished; stops the worker when the caller went away

    def synthesize(self, request: SynthesisRequest) -> Iterator[np.ndarray]:
        """Queue a synthesis; yield (N,) float32 chunks at `sample_rate` (QueueFull at once when full)."""
        job = self.submit("synthesize", request.to_wire())
        for _, chunk in self._results(job):
            yield chunk

    def prompt_features(self, source: str) -> PromptFeatures:
        """Prompt audio file -> PromptFeatures, computed in a worker (the ONNX models live there)."""
        for _, arrays in self._results(self.submit("features", {"source": str(source)})):
            return PromptFeatures.from_arrays(arrays)
        raise JobError("WorkerCrashed", "no result", 503)

    def alive(self) -> bool:
        """Every worker process is running (a crashed one is restarted with its next job)."""
        return bool(self._procs) and all(p.is_alive() for p in self._procs[-self.n_workers:])

    def stats(self) -> dict:
        with self._lock:
            busy = self._busy
        with self._ready:
            waiting = sum(not j.cancelled.is_set() for j in self._waiting)
        return {"workers": self.n_workers, "busy": busy, "waiting": waiting, "max_batch": self.max_batch,
                "capacity": self.n_workers * self.max_batch}

    def close(self) -> None:
        with self._ready:
            self._closing = True
            self._ready.notify_all()
        for p in self._procs:
            p.terminate()
        for p in self._procs:
            p.join(timeout=10)
