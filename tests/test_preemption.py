"""Preemption of running flow/HiFT work (`cosy.preemption`, `SpeechScheduler._yield_to_urgent`): a bulk
utterance's real flow solve lets a listener's work run between two of its ODE steps, pauses while a listener
waits for its first packet, stops at its next step once cancelled, and computes exactly what it computes alone."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from cosy.errors import Cancelled
from cosy.pipeline.jobs import FlowPrompt
from cosy.pipeline.token2wav import load_token2wav
from cosy.speech.request import LiveRequest
from cosy.speech.scheduler import SpeechScheduler


@pytest.fixture(scope="module")
def t2w(tiny_model_dir):
    return load_token2wav(tiny_model_dir, "cpu")


def _prompt(seed: int) -> FlowPrompt:
    g = torch.Generator().manual_seed(seed)
    return FlowPrompt(torch.randint(0, 100, (1, 40), generator=g), torch.randn(1, 80, 80, generator=g),
                      torch.randn(1, 192, generator=g))


def _tokens(seed: int, n: int) -> torch.Tensor:
    return torch.randint(0, 100, (1, n), generator=torch.Generator().manual_seed(seed))


class _Bulk:
    """A bulk request's whole utterance run on `sched` in its own thread; `started` is set inside the runner
    before the flow begins, which then waits for `go` (so the test places its listener first)."""

    def __init__(self, sched: SpeechScheduler, t2w, tokens: torch.Tensor, prompt: FlowPrompt):
        self.request = LiveRequest(10, "synthesize", {"priority": "bulk"})
        self.started, self.go, self.done = threading.Event(), threading.Event(), threading.Event()
        self.result = self.error = None

        def fn():
            self.started.set()
            assert self.go.wait(10)
            return t2w(tokens, prompt, seed=0)

        def thread():
            sched.bind(self.request)
            try:
                self.result = sched.run(True, fn)
            except BaseException as e:
                self.error = e
            self.done.set()

        threading.Thread(target=thread, daemon=True).start()
        assert self.started.wait(10)


@pytest.mark.quick
def test_a_listeners_chunk_runs_between_two_steps_of_a_running_bulk_flow_and_both_are_exact(t2w):
    prompt = _prompt(0)
    bulk_tokens, listener_tokens = _tokens(1, 150), _tokens(2, 30)
    bulk_alone, listener_alone = t2w(bulk_tokens, prompt, seed=0), t2w(listener_tokens, prompt, seed=0)
    sched = SpeechScheduler(starve_after=30.0)
    finished = []
    bulk = _Bulk(sched, t2w, bulk_tokens, prompt)  # running: its flow waits for `go`
    listener = LiveRequest(11, "synthesize", {"priority": "interactive"})
    out = {}

    def listener_thread():
        sched.bind(listener)
        out["audio"] = sched.run(False, lambda: t2w(listener_tokens, prompt, seed=0))
        finished.append("listener")

    t = threading.Thread(target=listener_thread, daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while sched.pending() == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert sched.pending() == 1
    bulk.go.set()  # the flow starts; the listener's item is queued, so it runs at the first step's end
    assert bulk.done.wait(30) and bulk.error is None, bulk.error
    finished.append("bulk")
    t.join(10)
    sched.close()
    assert finished == ["listener", "bulk"], "the listener's chunk waited for the whole bulk utterance"
    assert torch.equal(bulk.result, bulk_alone) and torch.equal(out["audio"], listener_alone)


@pytest.mark.quick
def test_a_running_bulk_flow_pauses_while_a_listener_awaits_its_first_packet_and_stops_once_cancelled(t2w):
    prompt, tokens = _prompt(3), _tokens(4, 60)
    alone = t2w(tokens, prompt, seed=0)
    sched = SpeechScheduler(starve_after=30.0, hold_first=60.0)
    bulk = _Bulk(sched, t2w, tokens, prompt)
    listener = LiveRequest(11, "synthesize", {"priority": "interactive", "stream": True})
    sched.bind(listener)  # it arrives while the bulk utterance runs; its LM has not made a chunk yet
    bulk.go.set()
    assert not bulk.done.wait(1.0), "a bulk flow ran on while a listener waited for its first packet"
    sched.heard(listener)  # its first packet is out: the paused flow goes on, and computes what it does alone
    assert bulk.done.wait(30) and bulk.error is None, bulk.error
    assert torch.equal(bulk.result, alone)

    bulk = _Bulk(sched, t2w, tokens, prompt)
    sched.bind(LiveRequest(12, "synthesize", {"priority": "interactive", "stream": True}))
    bulk.go.set()
    assert not bulk.done.wait(0.5)
    bulk.request.cancelled.set()  # its client went away: it stops at its next step, not after 60 s of hold
    assert bulk.done.wait(5) and isinstance(bulk.error, Cancelled)
    sched.close()
