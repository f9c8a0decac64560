"""Preemption points: where a long computation (a whole utterance's flow solve, its vocoder pass) may let more
urgent work run, on the same thread, before it goes on.

Code that computes step by step calls `preemption_point()` between steps. It does nothing unless the calling
thread runs the computation under `preemptible(hook)`: then the hook runs there, and may run other work first
(the speech scheduler runs a listener's chunk between two ODE steps of a bulk utterance) or raise to stop the
computation (its request was cancelled). While the hook runs it is off, so the work it runs is not preempted
in turn.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_local = threading.local()


def preemption_point() -> None:
    """Let the thread's scheduler run more urgent work now (nothing outside `preemptible`)."""
    hook = getattr(_local, "hook", None)
    if hook is None:
        return
    _local.hook = None
    try:
        hook()
    finally:
        _local.hook = hook


@contextmanager
def preemptible(hook: Callable[[], None]) -> Iterator[None]:
    """Run the block with `hook` called at each of its preemption points (on this thread)."""
    saved = getattr(_local, "hook", None)
    _local.hook = hook
    try:
        yield
    finally:
        _local.hook = saved
