"""The frontend's worker pool: parallel workers, one fair queue with a limit, cancellation, errors."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from conftest import ASSETS
from worker_hooks import unhurried_lm

from cosy.errors import JobError
from cosy.pipeline.request import SynthesisRequest
from cosy.service.job_queue import QueueFull
from cosy.service.workers import EngineSpec, WorkerPool

ZS_WAV = str(ASSETS / "zero_shot_prompt.wav")
ZS_TEXT = "希望你以后能够做的比我还好呦。"
SENTENCE = "今天天气很好，我们一起去公园散步，看看花草树木。"
LONG = SENTENCE * 3
# The random LM seldom samples its stop token: uncapped it runs to 20 tokens per text token (1000 for LONG).
# The pool's mechanics need a few seconds of work per request, so its LM makes this many (--fixed_tokens).
TOKENS = 200


@pytest.fixture(scope="module")
def pool(tiny_model_dir):
    p = WorkerPool(EngineSpec(str(tiny_model_dir), fixed_tokens=TOKENS), workers=2, max_queue=3).start()
    yield p
    p.close()


def request(**kw) -> SynthesisRequest:
    base = dict(mode="zero_shot", text=LONG, prompt_text=ZS_TEXT, prompt_wav=ZS_WAV, seed=1)
    return SynthesisRequest(**{**base, **kw})


def test_two_workers_serve_two_requests_at_once(pool):
    spans = {}

    def run(name):
        start = time.monotonic()
        n = sum(len(c) for c in pool.synthesize(request()))
        spans[name] = (start, time.monotonic(), n)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (s0, e0, n0), (s1, e1, n1) = spans[0], spans[1]
    assert n0 == n1 > 0  # same seed, same audio
    overlap = min(e0, e1) - max(s0, s1)
    print(f"request spans {e0 - s0:.2f} s and {e1 - s1:.2f} s overlap by {overlap:.2f} s")
    assert overlap > 0.5 * min(e0 - s0, e1 - s1)  # they ran side by side, not one after the other


def test_queue_limit_refuses_at_once_with_retry_information(pool):
    gens = [pool.synthesize(request(stream=True)) for _ in range(5)]
    started = [next(g) for g in gens[:2]]  # both workers busy
    assert all(len(c) > 0 for c in started)
    extra = [pool.submit("synthesize", request().to_wire()) for _ in range(3)]  # fills the 3 waiting places
    with pytest.raises(QueueFull) as e:
        pool.submit("synthesize", request().to_wire())
    assert e.value.retry_after > 0 and "busy" in str(e.value)
    for job in extra:
        job.cancelled.set()
    for g in gens:
        g.close()  # callers going away cancel their jobs
    t = time.monotonic()
    assert sum(len(c) for c in pool.synthesize(request(text="你好。"))) > 0
    assert time.monotonic() - t < 30  # cancelled work did not hold the workers


def test_errors_come_back_with_their_kind(pool):
    with pytest.raises(JobError) as e:
        list(pool.synthesize(request(text="")))
    assert e.value.status == 400 and e.value.kind == "SynthesisError" and "text is empty" in str(e.value)
    with pytest.raises(JobError, match="does not exist") as e:
        pool.prompt_features("/nonexistent.wav")
    assert e.value.status == 400 and e.value.kind == "AudioError"


def test_prompt_features_and_saved_voice(pool):
    f = pool.prompt_features(ZS_WAV)
    assert f.mel.shape[1] == 2 * f.speech_tokens.shape[1] and f.embedding.shape == (1, 192)
    a = b"".join(c.tobytes() for c in pool.synthesize(request(text="你好。")))
    b = b"".join(c.tobytes() for c in pool.synthesize(SynthesisRequest(mode="voice", text="你好。",
                                                                       prompt_text=ZS_TEXT, voice=f, seed=1)))
    assert a == b


def test_a_worker_killed_mid_batch_fails_only_its_requests_and_is_replaced(tiny_model_dir):
    """SIGKILL of one worker process while it holds a batch of two streams: those two end with a clear
    WorkerCrashed (503, retry), the other worker's two finish, and the pool serves again with a new worker."""
    import os
    import signal

    # the LM unhurried: every stream is still running at the kill, yet each one is only 120 tokens (the
    # random LM made LONG * 3 a 3000-token stream, and then the streams outran the kill only by their length)
    p = WorkerPool(EngineSpec(str(tiny_model_dir), max_batch=2, fixed_tokens=120), workers=2, max_queue=4)
    p.worker_prepare = unhurried_lm
    p.start()
    try:
        started, results = threading.Barrier(5), {}

        def run(i: int) -> None:
            chunks = p.synthesize(request(seed=3, text=SENTENCE, stream=True))
            try:
                n = len(next(chunks))
                started.wait(120)
                results[i] = ("ok", n + sum(len(c) for c in chunks))
            except JobError as e:
                results[i] = ("error", e.kind, e.status, str(e))

        threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        started.wait(120)  # every stream has its first chunk: two per worker
        victim = p._procs[-2]
        os.kill(victim.pid, signal.SIGKILL)
        for t in threads:
            t.join(300)
        failed = [r for r in results.values() if r[0] == "error"]
        done = [r for r in results.values() if r[0] == "ok"]
        assert len(failed) == 2 and len(done) == 2, results
        assert all(r[1:3] == ("WorkerCrashed", 503) and "retry" in r[3] for r in failed), failed
        assert done[0][1] == done[1][1] > 0  # the survivors' audio is whole (same seed, same length)
        assert sum(len(c) for c in p.synthesize(request(text="你好。"))) > 0  # serving again
        deadline = time.monotonic() + 120
        while not p.alive():
            assert time.monotonic() < deadline, "the killed worker was not replaced"
            time.sleep(0.5)
        assert victim.pid not in [q.pid for q in p._procs[-2:]]
    finally:
        p.close()


STUCK = "这一句会卡住。"  # the text that makes `stuck_on_cancel`'s worker hang


def stuck_on_cancel(engine) -> None:
    """Worker prepare hook: a request for STUCK yields one chunk, then hangs deaf to every cancel (as a
    worker stuck in a native call or a deadlock would); other requests are served as usual."""
    synthesize = engine.synthesize

    def hanging(req, *args, **kwargs):
        chunks = synthesize(req, *args, **kwargs)
        yield next(chunks)
        if req.text == STUCK:
            while True:
                try:
                    time.sleep(0.05)
                except BaseException:  # the interrupt included: nothing gets it out
                    pass
        yield from chunks

    engine.synthesize = hanging


def test_a_worker_stuck_on_a_cancel_is_dumped_killed_and_replaced(tiny_model_dir, capfd, caplog):
    """A cancelled job whose worker never ends it: after `cancel_grace` s the worker's stacks go to its
    stderr (naming where it hangs), it is killed and restarted, and the pool serves the next request."""
    p = WorkerPool(EngineSpec(str(tiny_model_dir)), workers=1)
    p.worker_prepare, p.cancel_grace = stuck_on_cancel, 2.0
    p.start()
    try:
        first = p._procs[-1].pid
        chunks = p.synthesize(request(text=STUCK, stream=True))
        assert len(next(chunks)) > 0
        cancelled = time.monotonic()
        chunks.close()  # the caller goes away
        while p.stats()["busy"]:
            assert time.monotonic() < cancelled + 60, "the stuck worker still holds its job"
            time.sleep(0.05)
        took = time.monotonic() - cancelled
        assert 2.0 <= took < 30, took  # not before the grace, and not much after it
        assert "it is stuck" in caplog.text and "[" in caplog.text
        err = capfd.readouterr().err
        assert "in hanging" in err and "test_service.py" in err, err[-2000:]  # the dump names the hang
        assert sum(len(c) for c in p.synthesize(request(text="你好。"))) > 0  # a new worker serves
        assert first not in [q.pid for q in p._procs[-1:]] and p.alive()
    finally:
        p.close()


class _SignalOnArming:
    """`_Interrupt.armed` whose every assignment first lets the interrupt land (as SIGUSR1 may, on any
    line): the handler raises when the flag is up and the cancel is set."""

    def __set_name__(self, owner, name):
        self.name = "_" + name

    def __get__(self, obj, objtype=None):
        return getattr(obj, self.name, False)

    def __set__(self, obj, value):
        if getattr(obj, "_in_handler", False):  # the handler's own `armed = False`
            setattr(obj, self.name, value)
            return
        obj._in_handler = True
        try:
            obj.handler(None, None)  # the signal, just before the assignment
            setattr(obj, self.name, value)
            obj.handler(None, None)  # and just after it
        finally:
            obj._in_handler = False


@pytest.mark.quick
@pytest.mark.parametrize("chunks", [0, 1, 3])
def test_an_interrupt_on_any_line_of_the_wrappers_bookkeeping_is_a_cancel(chunks):
    """The interrupt must end the job as Cancelled (answered "done"), never escape as `_Interrupted`
    (which would end the worker process)."""
    from cosy.errors import Cancelled
    from cosy.service import process

    class Armed(process._Interrupt):
        armed = _SignalOnArming()

    cancel = threading.Event()
    cancel.set()
    it = Armed(cancel)
    wrapped = it.synthesize(lambda: (np.zeros(4, np.float32) for _ in range(chunks)))
    with pytest.raises(Cancelled):
        list(wrapped())
    assert not it.armed
