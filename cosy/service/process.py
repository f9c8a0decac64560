"""What runs inside one synthesis worker process: the engine, and the loop that answers the pool's messages.

Messages from the pool (`cosy.service.workers.WorkerPool`) over a Pipe: `(job_id, kind, payload)` starts a
job, `("text", job_id, piece)` brings a "duplex" job its next text piece (None: the text ended),
`("cancel", job_id)` cancels one, `None` ends the process. Answers: `("ready", sample_rate)` or
`("failed", why)` once at start, then `("chunk"|"result"|"done"|"error", job_id, data)`, for a synthesis
`("mark", job_id, SentenceMark.to_wire())` in order with its chunks (a sentence begins before its first
chunk, ends after its last), and for a duplex job `("taken", job_id, text)` as its LM takes each
normalized piece. At max_batch 1 the
worker runs one job at a time here; above, `cosy.speech.worker.serve` holds many.
"""
from __future__ import annotations

import faulthandler
import logging
import os
import signal
from collections import deque
from dataclasses import dataclass, field

from cosy.deploy.cpus import usable_cores
from cosy.errors import Cancelled, JobError
from cosy.lm.call import start_call
from cosy.pipeline.request import PRIORITY_AGING, SynthesisRequest
from cosy.pipeline.timing import SentenceMark

log = logging.getLogger(__name__)


@dataclass
class EngineSpec:
    """How a worker builds its Engine (picklable: it crosses into the worker process)."""

    model_dir: str
    device: str = "cpu"  # this worker's ("cuda:1"); the pool's spec may list several (`cosy.service.placement`)
    dtype: str = "float32"  # the LM's and flow estimator's (`cosy.model.precision`)
    tf32: bool = True  # TF32 on CUDA (False: strict float32)
    compile: bool = False  # torch.compile the estimator and the embedded LM (cosy.pipeline.compiled)
    ttsfrd_dir: str | None = None
    llm_base_url: str | None = None
    llm_api_key: str | None = None
    threads: int | None = None
    llm_stall_timeout: float | None = None  # seconds without an LM token before the backend counts as stalled
    llm_queue_timeout: float | None = None  # seconds to the first token while the backend sends keep-alives only
    llm_split_first_chunk: str = "auto"  # a stream's first chunk decoded apart (cosy.lm.first_chunk)
    max_batch: int = 1  # live requests per worker process (1: the old one-request-at-a-time loop)
    flow_batch: int = 1  # requests whose flows may run as one padded batch (1: each alone)
    cache_mb: int = 0  # streaming flow state budget (cosy.speech.cache); 0 recomputes every prefix
    lm_batch: int = 0  # embedded LM with max_batch > 1: decode up to this many live requests a step (0, 1: off)
    fixed_tokens: int = 0  # benchmarks only: every request generates exactly this many speech tokens
    llm_variant: str | None = None  # another LM checkpoint of the family (CosyVoice3 "rl": llm.rl.pt)
    priority_aging: float = PRIORITY_AGING  # s a waiting work item takes to move up one priority class
    aligner: str | None = None  # --aligner: the forced aligner's directory, loaded by each worker (cosy.align)
    env: dict[str, str] = field(default_factory=dict)  # set in the worker before CUDA starts (MPS pipe dir)


INTERRUPT = getattr(signal, "SIGUSR1", None)  # the dispatcher's "stop computing now" (POSIX)
DUMP = getattr(signal, "SIGUSR2", None)  # "write every thread's stack to stderr" (a worker that does not stop)


_END = object()  # `_Interrupt._next`: the chunks ended


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
                    try:  # the signal may land on any line of `_next`, its clean-up included
                        chunk = self._next(chunks)
                    except _Interrupted:
                        raise Cancelled("cancelled") from None
                    if chunk is _END:
                        return
                    yield chunk
            finally:
                chunks.close()
        return wrapped

    def _next(self, chunks):
        """The next chunk (or _END), computed armed; disarmed again on every way out."""
        self.armed = True
        try:
            if self.cancel.is_set():  # (a signal sent before we armed is not lost)
                raise _Interrupted()
            return next(chunks)
        except StopIteration:
            return _END
        finally:
            self.armed = False


class _CancellableLM:
    """The engine's LM, checking the worker's cancel event between tokens (so a cancelled job stops inside
    the LM, not only at its next audio chunk); closing the token stream aborts a remote request. While it
    waits for a token the interrupt is disarmed (see `_Interrupt`)."""

    def __init__(self, lm, cancel, interrupt: _Interrupt | None = None):
        self.lm, self.cancel, self.interrupt = lm, cancel, interrupt

    def __getattr__(self, name):
        attr = getattr(self.lm, name)
        if name == "complete":  # a remote LM's continued decode (duplex): guarded like generate
            return lambda *args, **kwargs: self._guarded(attr(*args, **kwargs))
        return attr

    def generate(self, *args, **kwargs):
        return self._guarded(self.lm.generate(*args, **kwargs))

    def _guarded(self, tokens):
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


class TextInbox:
    """The text pieces of the running duplex job (max_batch 1), read from the pipe when the LM needs the
    next one; a cancel seen meanwhile ends the job. The interrupt is disarmed while it reads (a signal must
    not tear a message half read: the cancel message that follows the signal ends the wait)."""

    def __init__(self, conn, job_id: int, interrupt: _Interrupt | None = None):
        self.conn, self.job_id, self.interrupt = conn, job_id, interrupt
        self.queued: deque = deque()
        self.cancelled = False

    def _recv(self):
        return self._unarmed(self.conn.recv)

    def taken(self, text: str) -> None:
        """Tell the pool the LM took this normalized text (`Engine.synthesize_duplex`'s on_text)."""
        self._unarmed(lambda: self.conn.send(("taken", self.job_id, text)))

    def mark(self, mark: SentenceMark) -> None:
        """Tell the pool a sentence begins or ends (`Engine.synthesize`'s on_mark), in order with the chunks."""
        self._unarmed(lambda: self.conn.send(("mark", self.job_id, mark.to_wire())))

    def _unarmed(self, io):
        it = self.interrupt
        if it is None:
            return io()
        armed, it.armed = it.armed, False
        try:
            return io()
        finally:
            it.armed = armed

    def take(self, msg) -> None:
        """A message that arrived while the job runs."""
        if msg is None:
            raise EOFError
        if msg[0] == "text" and msg[1] == self.job_id:
            self.queued.append(msg[2])
        elif msg == ("cancel", self.job_id):
            self.cancelled = True

    def pieces(self):
        while True:
            while not self.queued:
                if self.cancelled:
                    raise Cancelled("cancelled")
                self.take(self._recv())
            piece = self.queued.popleft()
            if piece is None:
                return
            yield piece


def worker_main(spec: EngineSpec, conn, cancel=None, health=None, prepare=None) -> None:
    """Worker process: build the engine (`prepare(engine)` may adjust it: benchmarks fix the token count),
    then run its jobs: one at a time (max_batch 1) or up to max_batch at once (`cosy.speech.worker`).

    `cancel`: an event the dispatcher sets when the running job's caller went away (max_batch 1); `health`:
    the shared dead-until table of the LM backends (the parent's /ready reads and writes it too). The
    worker ignores SIGINT (Ctrl-C is the parent's to handle), writes its threads' stacks to stderr on
    SIGUSR2, and ends quietly when its pipe closes."""
    os.environ.update(spec.env)  # before anything starts CUDA in this process
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if DUMP is not None:  # answered in C, whatever the main thread is stuck in
        faulthandler.register(DUMP, all_threads=True)
    if INTERRUPT is not None:  # until the engine is built: a stray interrupt must not kill the worker
        signal.signal(INTERRUPT, signal.SIG_IGN)
    try:
        _serve(spec, conn, cancel, health, prepare)
    except (EOFError, OSError, KeyboardInterrupt):  # the parent went away or closed us: nothing to report
        pass


def _serve(spec: EngineSpec, conn, cancel, health, prepare) -> None:
    import torch

    from cosy.lm.model import SpeechLM
    from cosy.lm.watchdog import WATCHDOG
    from cosy.pipeline.engine import Engine

    torch.set_num_threads(spec.threads or usable_cores())
    if spec.device.startswith("cuda:"):  # this worker's GPU is the current one (cuDNN handles, bare "cuda")
        torch.cuda.set_device(spec.device)
    try:
        engine = Engine.from_model_dir(spec.model_dir, device=spec.device, dtype=spec.dtype,
                                       ttsfrd_dir=spec.ttsfrd_dir, llm_base_url=spec.llm_base_url,
                                       llm_api_key=spec.llm_api_key, cache_mb=spec.cache_mb, tf32=spec.tf32,
                                       llm_variant=spec.llm_variant, compile=spec.compile,
                                       flow_batch=spec.flow_batch if spec.max_batch > 1 else 1,
                                       # a backend not up yet (compose, Kubernetes start them in any order)
                                       # is the pool's to retry and /ready's to report, not a failed start
                                       require_backend=False, llm_split_first_chunk=spec.llm_split_first_chunk)
    except Exception as e:  # reported to the parent, which refuses to start
        conn.send(("failed", f"{type(e).__name__}: {e}"))
        return
    if spec.llm_base_url:  # the LM backends' client, imported (with openai) only then, as Engine does
        from cosy.lm.pool import BackendPool
        if isinstance(engine.lm, BackendPool):
            engine.lm.configure(stall_timeout=spec.llm_stall_timeout, queue_timeout=spec.llm_queue_timeout,
                               shared_health=health)
    if spec.lm_batch > 1 and spec.max_batch > 1 and isinstance(engine.lm, SpeechLM):
        from cosy.lm.decode_batch import BatchedLM
        engine.lm = BatchedLM(engine.lm, min(spec.lm_batch, spec.max_batch))
    if spec.fixed_tokens:
        from cosy.lm.fixed_length import FixedLengthLM
        engine.lm = FixedLengthLM(engine.lm, spec.fixed_tokens)
    if spec.aligner:  # word timings: each worker aligns its own requests' audio, on its device
        try:
            from cosy.align.aligner import Aligner
            from cosy.align.marks import with_words
            aligner = Aligner.load(spec.aligner, device=spec.device)
        except Exception as e:  # reported to the parent, which refuses to start
            conn.send(("failed", f"--aligner: {type(e).__name__}: {e}"))
            return
        engine.synthesize = with_words(engine.synthesize, aligner)
        engine.synthesize_duplex = with_words(engine.synthesize_duplex, aligner)
    if prepare is not None:
        prepare(engine)
    if spec.max_batch > 1:  # many live requests, their flow/HiFT work scheduled (cosy.speech)
        from cosy.speech.worker import serve
        conn.send(("ready", engine.sample_rate))
        serve(engine, conn, spec.flow_batch, spec.priority_aging)
        return
    interrupt = None
    if cancel is not None:
        interrupt = _Interrupt(cancel)
        if INTERRUPT is not None:
            signal.signal(INTERRUPT, interrupt.handler)
        engine.lm = _CancellableLM(engine.lm, cancel, interrupt)
        WATCHDOG.abort_when(cancel)  # a remote LM request waiting in the backend's queue is closed too
        engine.synthesize = interrupt.synthesize(engine.synthesize)
        engine.synthesize_duplex = interrupt.synthesize(engine.synthesize_duplex)
    conn.send(("ready", engine.sample_rate))
    while (msg := conn.recv()) is not None:
        if msg[0] in ("cancel", "text"):  # for a job that has finished meanwhile
            continue
        job_id, kind, payload = msg
        call = None
        try:
            if kind == "features":
                conn.send(("result", job_id, engine.prompt_features(payload["source"]).to_arrays()))
            else:
                inbox = TextInbox(conn, job_id, interrupt)
                req = SynthesisRequest.from_wire(payload)
                call = start_call(req.priority)  # this job's LM requests carry its class, report their wait
                chunks = (engine.synthesize_duplex(req, inbox.pieces(), inbox.taken, on_mark=inbox.mark)
                          if kind == "duplex" else engine.synthesize(req, on_mark=inbox.mark))
                try:
                    for chunk in chunks:
                        if cancel is not None and cancel.is_set():
                            break
                        conn.send(("chunk", job_id, chunk.numpy()))
                        while conn.poll() and not inbox.cancelled:  # text pieces wait in the inbox
                            inbox.take(conn.recv())
                        if inbox.cancelled:
                            break
                finally:
                    chunks.close()
            conn.send(("done", job_id, None if call is None else {"backend_seconds": call.backend_seconds}))
        except Cancelled:
            conn.send(("done", job_id, None))  # nobody listens any more
        except Exception as e:
            log.debug("job %s failed", job_id, exc_info=True)
            conn.send(("error", job_id, JobError.wire(e)))
