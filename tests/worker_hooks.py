"""Hooks that change a built engine's LM, for tests: run in the test's process, or in a spawned speech worker
(`WorkerPool.worker_prepare`), which imports this module to unpickle them. Hence a module of its own that
imports nothing: a hook defined in conftest.py made each such worker import conftest and, through it, the HTTP
test stack (openai, av, httpx: 1.2 CPU s a worker)."""
from __future__ import annotations

import time


def cap_lm(engine, cap: int) -> None:
    """Each `engine.lm.generate` call ends by max(min_len, cap) tokens. A random LM seldom samples its stop
    token, so it runs to max_len (20 speech tokens per text token: 300 for a 15-token sentence); a test of
    equality or lengths needs a few streaming chunks (28, then 25 tokens each), not that."""
    generate = engine.lm.generate

    def capped(prompt_embeds, min_len, max_len, *args, **kw):
        return generate(prompt_embeds, min_len, min(max_len, max(min_len, cap)), *args, **kw)

    engine.lm.generate = capped


TOKEN_DELAY = 0.04  # s, `unhurried_lm`'s wait before each token


def unhurried_lm(engine) -> None:
    """Worker prepare hook (`WorkerPool.worker_prepare`): the LM waits TOKEN_DELAY s before each token, as a
    busy backend does. A request then lasts seconds of wall time at little CPU: a test that needs streams
    still running (at a kill, a cancel, a full pool) gets them without synthesizing minutes of audio."""
    generate = engine.lm.generate

    def unhurried(*args, **kwargs):
        tokens = generate(*args, **kwargs)
        try:
            for token in tokens:
                time.sleep(TOKEN_DELAY)
                yield token
        finally:
            tokens.close()  # a cancelled request aborts the LM's work too

    engine.lm.generate = unhurried


def take_lm(engine, n: int) -> None:
    """Each `engine.lm.generate` call yields at most `n` tokens, then closes the stream (a backend aborts the
    request), while the backend is asked for the request's own max_len, which it must accept: a test of what
    is sent runs the real request without synthesizing all the audio a random LM would make."""
    generate = engine.lm.generate

    def taken(*args, **kwargs):
        tokens = generate(*args, **kwargs)
        try:
            for i, token in enumerate(tokens):
                if i >= n:
                    return
                yield token
        finally:
            tokens.close()

    engine.lm.generate = taken
