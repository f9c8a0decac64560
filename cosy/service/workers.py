"""Synthesis worker processes behind one fair queue, shared by the WebUI and every API of a frontend.

Each worker process holds its own `Engine` (text frontend, prompt encoder, flow, HiFT, and the embedded
LM or a client of the LM backends), so `--workers N` serves N requests at once. Jobs wait in one FIFO
queue; a free worker takes the oldest. Past `max_queue` waiting jobs, `submit` refuses at once with
`QueueFull` (the HTTP layer answers 429 with Retry-After) instead of letting callers hang. A caller that
goes away cancels its job wherever it is: a waiting job leaves the queue at once (it no longer counts in
`waiting`), a running one stops at its next LM token (a remote LM request is aborted) or, inside flow/HiFT,
within one tensor operation: the worker learns it through a shared event (seen between tokens and chunks)
and a signal (SIGUSR1) that interrupts the engine's computation, so a long chunk is not computed in vain.
"""
from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from cosy.errors import Busy, CosyError, JobError
from cosy.pipeline.request import SynthesisRequest
from cosy.prompt.encoder import PromptFeatures

log = logging.getLogger(__name__)


class QueueFull(Busy):
    def __init__(self, waiting: int, retry_after: float):
        super().__init__(f"the server is busy ({waiting} requests waiting); retry in {retry_after:.0f} s",
                         retry_after=retry_after)


class Cancelled(CosyError):
    """The caller went away (or cancelled): the job was dropped; 499 as nginx says "client closed request"."""

    status = 499


@dataclass
class EngineSpec:
    """How a worker builds its Engine (picklable: it crosses into the worker process)."""

    model_dir: str
    device: str = "cpu"
    ttsfrd_dir: str | None = None
    llm_base_url: str | None = None
    llm_api_key: str | None = None
    threads: int | None = None
    llm_stall_timeout: float | None = None  # seconds without an LM token before the backend counts as stalled


@dataclass
class Job:
    id: int
    kind: str  # "synthesize" (payload: SynthesisRequest.to_wire()) or "features" (payload: {"source": path})
    payload: dict
    out: queue.Queue = field(default_factory=queue.Queue)  # ("chunk"|"result"|"done"|"error", data)
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.monotonic)


INTERRUPT = getattr(signal, "SIGUSR1", None)  # the dispatcher's "stop computing now" (POSIX)


class _Interrupted(BaseException):
    """Raised by the SIGUSR1 handler inside the engine's computation (a BaseException: no `except
    Exception` on the way swallows it); becomes `Cancelled`."""


class _Interrupt:
    """Where the worker's main thread is: `armed` while the engine computes (flow, HiFT, text) for a job
    that may be cancelled, not while it waits for an LM token (its client, pool counters and locks must
    not be torn mid-way: the cancel event is checked after each token) nor while it talks to the parent."""

    def __init__(self, cancel):
        self.cancel, self.armed = cancel, False

    def handler(self, signum, frame) -> None:
        if self.armed and self.cancel.is_set():
            self.armed = False
            raise _Interrupted()

    def synthesize(self, synthesize):
        """Wrap `engine.synthesize`: each next chunk is computed armed; Cancelled if interrupted."""
        def wrapped(*args, **kwargs):
            chunks = synthesize(*args, **kwargs)
            try:
                while True:
                    self.armed = True
                    try:
                        if self.cancel.is_set():  # (a signal sent before we armed is not lost)
                            raise _Interrupted()
                        chunk = next(chunks)
                    except StopIteration:
                        return
                    except _Interrupted:
                        raise Cancelled("cancelled") from None
                    finally:
                        self.armed = False
                    yield chunk
            finally:
                chunks.close()
        return wrapped


class _CancellableLM:
    """The engine's LM, checking the worker's cancel event between tokens (so a cancelled job stops inside
    the LM, not only at its next audio chunk); closing the token stream aborts a remote request. While it
    waits for a token the interrupt is disarmed (see `_Interrupt`)."""

    def __init__(self, lm, cancel, interrupt: _Interrupt | None = None):
        self.lm, self.cancel, self.interrupt = lm, cancel, interrupt

    def __getattr__(self, name):
        return getattr(self.lm, name)

    def generate(self, *args, **kwargs):
        tokens = self.lm.generate(*args, **kwargs)
        it, armed = self.interrupt, False
        try:
            while True:
                if it is not None:
                    armed, it.armed = it.armed, False
                try:
                    token = next(tokens)
                except StopIteration:
                    return
                finally:
                    if it is not None:
                        it.armed = armed
                if self.cancel.is_set():
                    raise Cancelled("cancelled")
                yield token
        finally:
            if it is not None:
                armed, it.armed = it.armed, False
            try:
                tokens.close()
            finally:
                if it is not None:
                    it.armed = armed


def _worker_main(spec: EngineSpec, conn, cancel=None, health=None) -> None:
    """Worker process: build the engine, then run one job at a time from the dispatcher.

    `cancel`: an event the dispatcher sets when the running job's caller went away; `health`: the shared
    dead-until table of the LM backends (the parent's /ready reads and writes it too). The worker ignores
    SIGINT (Ctrl-C is the parent's to handle) and ends quietly when its pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if INTERRUPT is not None:  # until the engine is built: a stray interrupt must not kill the worker
        signal.signal(INTERRUPT, signal.SIG_IGN)
    try:
        _serve(spec, conn, cancel, health)
    except (EOFError, OSError, KeyboardInterrupt):  # the parent went away or closed us: nothing to report
        pass


def _serve(spec: EngineSpec, conn, cancel, health) -> None:
    import torch

    from cosy.lm.pool import BackendPool
    from cosy.pipeline.engine import Engine

    torch.set_num_threads(spec.threads or max(1, (os.cpu_count() or 1)))
    try:
        engine = Engine.from_model_dir(spec.model_dir, device=spec.device, ttsfrd_dir=spec.ttsfrd_dir,
                                       llm_base_url=spec.llm_base_url, llm_api_key=spec.llm_api_key)
    except Exception as e:  # reported to the parent, which refuses to start
        conn.send(("failed", f"{type(e).__name__}: {e}"))
        return
    if isinstance(engine.lm, BackendPool):
        engine.lm.configure(stall_timeout=spec.llm_stall_timeout, shared_health=health)
    if cancel is not None:
        interrupt = _Interrupt(cancel)
        if INTERRUPT is not None:
            signal.signal(INTERRUPT, interrupt.handler)
        engine.lm = _CancellableLM(engine.lm, cancel, interrupt)
        engine.synthesize = interrupt.synthesize(engine.synthesize)
    conn.send(("ready", engine.sample_rate))
    while (msg := conn.recv()) is not None:
        if msg[0] == "cancel":  # for a job that has finished meanwhile
            continue
        job_id, kind, payload = msg
        try:
            if kind == "features":
                conn.send(("result", job_id, engine.prompt_features(payload["source"]).to_arrays()))
            else:
                chunks = engine.synthesize(SynthesisRequest.from_wire(payload))
                try:
                    for chunk in chunks:
                        if cancel is not None and cancel.is_set():
                            break
                        conn.send(("chunk", job_id, chunk.numpy()))
                        if conn.poll() and conn.recv() == ("cancel", job_id):
                            break
                finally:
                    chunks.close()
            conn.send(("done", job_id, None))
        except Cancelled:
            conn.send(("done", job_id, None))  # nobody listens any more
        except Exception as e:
            log.debug("job %s failed", job_id, exc_info=True)
            conn.send(("error", job_id, JobError.wire(e)))


class WorkerPool:
    def __init__(self, spec: EngineSpec, workers: int = 1, max_queue: int = 64, start_timeout: float = 900):
        if workers < 1:
            raise ValueError("workers must be >= 1")
        self.spec, self.n_workers, self.max_queue = spec, workers, max_queue
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
        self._conns: list = []
        self._pids: dict = {}  # worker pipe -> its process id (to interrupt its computation)
        self._closing = False
        self._ctx = mp.get_context("spawn")
        urls = [u for u in (spec.llm_base_url or "").split(",") if u.strip()]
        # dead-until (time.monotonic(), system-wide) per LM backend, shared by every worker's BackendPool
        # and this process's /ready, so that both agree on which backends are usable
        self.backend_health = self._ctx.Array("d", len(urls)) if urls else None

    def start(self) -> "WorkerPool":
        """Start every worker and wait until each has loaded its models; RuntimeError if one fails."""
        ctx = self._ctx
        conns = []
        for _ in range(self.n_workers):
            conns.append(self._spawn(ctx))
        for i, (conn, cancel) in enumerate(conns):
            t = threading.Thread(target=self._dispatch, args=(i, conn, cancel, ctx), daemon=True, name=f"worker-{i}")
            self._threads.append(t)
            t.start()
        return self

    def _spawn(self, ctx):
        parent, child = ctx.Pipe()
        cancel = ctx.Event()
        spec = self.spec
        if spec.threads is None:  # share the cores between the workers
            spec = EngineSpec(**{**vars(spec), "threads": max(1, (os.cpu_count() or 1) // self.n_workers)})
        proc = ctx.Process(target=_worker_main, args=(spec, child, cancel, self.backend_health), daemon=True)
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
        self._pids[parent] = proc.pid
        return parent, cancel

    def _dispatch(self, index: int, conn, cancel, ctx) -> None:
        """One thread per worker: hand it the oldest waiting job, relay its messages back."""
        while True:
            with self._ready:
                while not self._waiting and not self._closing:
                    self._ready.wait()
                if self._closing:
                    return
                job = self._waiting.popleft()
                if job.cancelled.is_set():
                    continue
                with self._lock:  # counted busy before it stops counting as waiting: no gap in the metrics
                    self._busy += 1
            start = time.monotonic()
            try:
                cancel.clear()
                conn.send((job.id, job.kind, job.payload))
                self._relay(job, conn, cancel)
            except (EOFError, OSError):
                job.out.put(("error", ("WorkerCrashed", "the synthesis worker stopped unexpectedly; retry", 503, None)))
                if self._closing:
                    return
                log.error("worker %d died; restarting it", index)
                try:
                    conn, cancel = self._spawn(ctx)
                except RuntimeError:
                    log.exception("worker %d could not be restarted", index)
                    return
            finally:
                with self._lock:
                    self._busy -= 1
                    self._job_seconds = 0.8 * self._job_seconds + 0.2 * (time.monotonic() - start)

    def _relay(self, job: Job, conn, cancel) -> None:
        cancel_sent = False
        while True:
            if job.cancelled.is_set() and not cancel_sent:
                cancel.set()  # seen by the worker inside the LM, between tokens
                conn.send(("cancel", job.id))
                cancel_sent = True
                if INTERRUPT is not None and job.kind == "synthesize" and conn in self._pids:
                    try:  # stops flow/HiFT within one tensor operation (see _Interrupt)
                        os.kill(self._pids[conn], INTERRUPT)
                    except OSError:
                        pass
            if not conn.poll(0.05):
                if self._closing:
                    raise EOFError
                continue
            kind, job_id, data = conn.recv()
            if job_id != job.id:
                continue
            if not cancel_sent:
                job.out.put((kind, data))
            if kind in ("done", "error"):
                return

    def submit(self, kind: str, payload: dict, cancelled: threading.Event | None = None) -> Job:
        """Queue a job; QueueFull at once when `max_queue` jobs already wait. `cancelled`: the caller's own
        event (set it to cancel the job; `cancel(job)` does that and frees the queue place at once)."""
        job = Job(next(self._ids), kind, payload)
        if cancelled is not None:
            job.cancelled = cancelled
        with self._ready:
            live = [j for j in self._waiting if not j.cancelled.is_set()]
            self._waiting = deque(live)
            if len(live) >= self.max_queue:
                raise QueueFull(len(live), self._job_seconds * (len(live) + 1) / self.n_workers)
            self._waiting.append(job)
            self._ready.notify()
        return job

    def cancel(self, job: Job) -> None:
        """The caller went away: a waiting job leaves the queue now, a running one is stopped by its worker."""
        job.cancelled.set()
        with self._ready:
            try:
                self._waiting.remove(job)
            except ValueError:
                pass  # running or finished

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

    def synthesize(self, request: SynthesisRequest, cancelled: threading.Event | None = None) -> Iterator[np.ndarray]:
        """Queue a synthesis; yield (N,) float32 chunks at `sample_rate` (QueueFull at once when full).
        Closing the iterator, or setting `cancelled`, cancels the job (`Cancelled` is raised to a reader)."""
        job = self.submit("synthesize", request.to_wire(), cancelled)
        for _, chunk in self._results(job):
            yield chunk

    def prompt_features(self, source: str, cancelled: threading.Event | None = None) -> PromptFeatures:
        """Prompt audio file -> PromptFeatures, computed in a worker (the ONNX models live there)."""
        for _, arrays in self._results(self.submit("features", {"source": str(source)}, cancelled)):
            return PromptFeatures.from_arrays(arrays)
        raise JobError("WorkerCrashed", "no result", 503)

    def alive(self) -> bool:
        """Every worker process is running (a crashed one is restarted with its next job)."""
        return bool(self._procs) and all(p.is_alive() for p in self._procs[-self.n_workers:])

    def stats(self) -> dict:
        with self._ready:
            waiting = sum(not j.cancelled.is_set() for j in self._waiting)
            with self._lock:
                busy = self._busy
        return {"workers": self.n_workers, "busy": busy, "waiting": waiting}

    def close(self, grace: float = 3.0) -> None:
        """Stop the workers: ask each to exit (closing its pipe), terminate those still running after
        `grace` s, kill the rest. Waiting jobs end with an error. Safe to call twice."""
        with self._ready:
            if self._closing and not self._procs:
                return
            self._closing = True
            waiting, self._waiting = list(self._waiting), deque()
            self._ready.notify_all()
        for job in waiting:
            job.out.put(("error", ("ShuttingDown", "the server is shutting down; retry", 503, None)))
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
        self._procs, self._conns, self._pids = [], [], {}
