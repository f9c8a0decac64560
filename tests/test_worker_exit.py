"""A worker process ends only after its threads: a daemon thread that frees a tensor while the interpreter
finalizes is killed inside torch's C++ and the process aborts with "terminate called without an active
exception" (what `python -m cosy batch` printed at exit). The speech scheduler's close waits for its runner
and fails the work still queued; `serve` cancels and waits for its job threads before it returns."""
from __future__ import annotations

import multiprocessing
import threading
import time

import pytest
from conftest import ASSETS

from cosy.errors import Cancelled
from cosy.pipeline.engine import Engine
from cosy.pipeline.request import SynthesisRequest
from cosy.speech.request import LiveRequest
from cosy.speech.scheduler import SpeechScheduler
from cosy.speech.worker import serve


def _new_threads(before: set[threading.Thread]) -> list[str]:
    return [t.name for t in threading.enumerate() if t not in before and t.is_alive()]


@pytest.mark.quick
def test_scheduler_close_waits_for_its_runner_and_cancels_the_queued_work():
    before = set(threading.enumerate())
    s, started, gate, errors = SpeechScheduler(), threading.Event(), threading.Event(), {}

    def request(name: str, fn) -> threading.Thread:
        def body():
            s.bind(LiveRequest(len(errors), "synthesize", {}))
            try:
                s.run(True, fn)
            except Cancelled as e:
                errors[name] = e
        t = threading.Thread(target=body, name=f"req-{name}", daemon=True)
        t.start()
        return t

    busy = request("busy", lambda: (started.set(), gate.wait(10)))
    assert started.wait(10)
    queued = request("queued", lambda: None)
    time.sleep(0.2)  # "queued" waits behind "busy"
    closing = threading.Thread(target=s.close, daemon=True)
    closing.start()
    closing.join(0.5)
    assert closing.is_alive()  # the runner is still inside "busy": close waits for it
    gate.set()
    closing.join(10)
    busy.join(10)
    queued.join(10)
    assert not closing.is_alive() and not queued.is_alive(), "a request waiting in the queue was never woken"
    assert "queued" in errors and "busy" not in errors
    assert _new_threads(before) == []  # the runner has ended


def test_serve_returns_only_after_its_job_threads_end(tiny_model_dir):
    engine = Engine.from_model_dir(tiny_model_dir)
    before = set(threading.enumerate())
    parent, child = multiprocessing.Pipe()
    server = threading.Thread(target=serve, args=(engine, child), name="serve", daemon=True)
    server.start()
    req = SynthesisRequest(mode="cross_lingual", prompt_wav=str(ASSETS / "cross_lingual_prompt.wav"), duplex=True)
    parent.send((1, "duplex", req.to_wire()))  # a duplex job waits for text that never comes
    time.sleep(0.5)
    assert "job-1" in _new_threads(before)
    parent.send(None)  # the dispatcher closes the worker
    server.join(30)
    assert not server.is_alive()
    assert _new_threads(before) == []  # no job thread and no runner outlives serve
