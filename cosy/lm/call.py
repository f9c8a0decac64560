"""What one synthesis request's LM calls carry to the backends and bring back, without threading it through
every signature between the worker and the client (`Engine`, `BackendPool`, first-chunk splits, bistream).

    with lm_call("bulk") as call:          # in the thread that runs the request (or `start_call`)
        for chunk in engine.synthesize(req):
            ...
    call.backend_seconds                   # time spent waiting for the backends' tokens

`RemoteLM` reads the current call: it sends `call.vllm_priority` as the completion's `priority` (vLLM's
priority scheduling: lower first) and adds its waits to `call.backend_seconds`. A context variable: each
request runs on its own thread, and a generator runs in the context of the thread that advances it.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from cosy.pipeline.request import priority_rank


@dataclass
class LMCall:
    priority: str | None = None  # the request's class (`cosy.pipeline.request.PRIORITIES`); None: default
    backend_seconds: float = 0.0  # waiting for the backends: from each request sent to its tokens' arrival

    @property
    def vllm_priority(self) -> int:
        """vLLM's `priority` for this class: interactive -1, default 0 (what a client that sends none
        gets), bulk 1."""
        return priority_rank(self.priority) - priority_rank("default")


_CURRENT: ContextVar[LMCall | None] = ContextVar("cosy_lm_call", default=None)


def current_call() -> LMCall | None:
    """The LM call of the request this thread runs, if any (None: a plain caller, e.g. the CLI)."""
    return _CURRENT.get()


def start_call(priority: str | None) -> LMCall:
    """From now on, the LM calls this thread makes belong to one request of class `priority` (a worker's
    thread starts one for each job it runs)."""
    call = LMCall(priority)
    _CURRENT.set(call)
    return call


@contextmanager
def lm_call(priority: str | None) -> Iterator[LMCall]:
    """The LM calls made in this thread inside the block belong to one request of class `priority`."""
    call = LMCall(priority)
    token = _CURRENT.set(call)
    try:
        yield call
    finally:
        _CURRENT.reset(token)
