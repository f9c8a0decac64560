"""Several LM backends behind one `generate`: each request goes to the least loaded live backend.

A backend that cannot be reached is skipped and tried again after a cool-down; a request that failed
before its first token moves on to the next backend. Once tokens have streamed, a failure is the
request's error (restarting it elsewhere would repeat audio). A backend that sends no token for
`stall_timeout` seconds counts as failed the same way (frozen: alive but not answering).

The dead-until table can live in shared memory (`configure(shared_health=...)`: a `multiprocessing.Array`
of doubles, one per backend, in `time.monotonic()` seconds), so that every worker process and the
frontend's `/ready` agree on which backends are usable.
"""
from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator

from torch import Tensor

from cosy.lm.first_chunk import MAX_SEED, split_decode
from cosy.lm.remote import BackendError, BackendUnavailable, RemoteLM
from cosy.lm.sampling import SamplingParams
from cosy.model.family import ModelFamily


class _SharedDeadUntil:
    """`dead_until[id(backend)]` backed by a shared array (index = the backend's place in the pool)."""

    def __init__(self, array, backends: list[RemoteLM]):
        self.array, self.index = array, {id(b): i for i, b in enumerate(backends)}

    def __getitem__(self, key: int) -> float:
        return self.array[self.index[key]]

    def __setitem__(self, key: int, value: float) -> None:
        self.array[self.index[key]] = value


class BackendPool:
    def __init__(self, backends: list[RemoteLM], cooldown: float = 10.0):
        if not backends:
            raise ValueError("no LM backend given")
        self.backends, self.cooldown = backends, cooldown
        self.in_flight = {id(b): 0 for b in backends}
        self.dead_until = {id(b): 0.0 for b in backends}
        self.errors: dict[int, str] = {}
        self.probing: set[int] = set()  # cooling-down backends with a probe in flight
        # re-entrant: a stream's `finally` takes it, and the garbage collector may run that finally (of a
        # generator dropped unclosed) inside `_pick` on the same thread; its counters stay consistent
        self._lock = threading.RLock()
        # speech ids -> (1, n, H) input embeddings: set (by the engine) to decode first chunks apart
        self.embed_speech: Callable[[list[int]], Tensor] | None = None

    def configure(self, stall_timeout: float | None = None, shared_health=None,
                  queue_timeout: float | None = None) -> None:
        """Set every backend's stall and queue timeouts (`RemoteLM`); keep the dead-until table in
        `shared_health` (one double per backend, in order; see the module doc)."""
        for b in self.backends:
            if stall_timeout is not None:
                b.stall_timeout = stall_timeout
            if queue_timeout is not None:
                b.queue_timeout = queue_timeout
        if shared_health is not None:
            if len(shared_health) != len(self.backends):
                raise ValueError("shared_health needs one entry per backend")
            view = _SharedDeadUntil(shared_health, self.backends)
            for b in self.backends:
                view[id(b)] = max(view[id(b)], self.dead_until[id(b)])
            self.dead_until = view

    @property
    def sampling(self) -> SamplingParams:
        return self.backends[0].sampling

    def check(self, require_reachable: bool = True) -> None:
        """At start-up: misconfiguration (bad key, wrong URL, other llm.pt) is fatal; the unreachable
        backends are marked dead and retried later. `require_reachable`: at least one must answer now (a
        one-shot command); a server starts without one (its /ready says why until one answers)."""
        for b in self.backends:
            try:
                b.check()
            except BackendUnavailable as e:
                self._mark_dead(b, str(e))
        if require_reachable and all(self.dead_until[id(b)] > time.monotonic() for b in self.backends):
            raise BackendUnavailable("no LM backend is reachable: " + "; ".join(self.errors.values()))

    def _mark_dead(self, b: RemoteLM, why: str) -> None:
        with self._lock:
            self.dead_until[id(b)] = time.monotonic() + self.cooldown
            self.errors[id(b)] = why

    def _pick(self, tried: set[int]) -> tuple[RemoteLM | None, bool]:
        """The live backend with the fewest requests in flight (dead ones whose cool-down is over count as
        live again); if all are cooling down, the one that comes back first, as a probe (True): tried once,
        without the retries a live one gets, and one probe at a time (None while one is out), so that
        requests fail fast while every backend is down."""
        with self._lock:
            now = time.monotonic()
            candidates = [b for b in self.backends if id(b) not in tried]
            if not candidates:
                return None, False
            live = [b for b in candidates if self.dead_until[id(b)] <= now]
            pool = live or sorted(candidates, key=lambda b: self.dead_until[id(b)])[:1]
            best = min(pool, key=lambda b: self.in_flight[id(b)])
            if not live:
                if id(best) in self.probing:
                    return None, False
                self.probing.add(id(best))
            self.in_flight[id(best)] += 1
            return best, not live

    def generate(self, prompt_embeds: Tensor, min_len: int, max_len: int, seed: int | None = None,
                 params: SamplingParams | None = None, first: int = 0,
                 history: list[int] | None = None) -> Iterator[int]:
        """`RemoteLM.generate` on the least loaded live backend. `first` > 0 (a streamed utterance's first
        chunk) with `embed_speech` set: the first `first` tokens as a request of their own, the rest when
        asked for (`cosy.lm.first_chunk`)."""
        if 0 < first < max_len and self.embed_speech is not None:
            seed = seed if seed is not None else random.randrange(MAX_SEED)
            return split_decode(self, self.embed_speech, prompt_embeds, min_len, max_len, first, seed,
                                params or self.sampling)
        return self._stream(lambda b, retries: b.generate(prompt_embeds, min_len, max_len, seed=seed, params=params,
                                                          retries=retries, history=history))

    def complete(self, *args, **kwargs) -> Iterator[int]:
        """`RemoteLM.complete` on the least loaded live backend (a continued decode sends its whole prefix,
        so each call may go to another backend)."""
        return self._stream(lambda b, retries: b.complete(*args, retries=retries, **kwargs))

    def _stream(self, call) -> Iterator[int]:
        tried: set[int] = set()
        while (picked := self._pick(tried))[0] is not None:
            b, probe = picked
            tried.add(id(b))
            tokens = call(b, 0 if probe else None)
            produced = 0
            try:
                for token in tokens:
                    produced += 1
                    if produced == 1:
                        self._mark_alive(b)  # it answers: others may use it now, not only after this stream
                    yield token
                self._mark_alive(b)
                return
            except BackendUnavailable as e:
                self._mark_dead(b, str(e))  # nothing streamed yet: the next backend takes the request
            except BackendError as e:
                if produced:  # died mid-stream: keep new requests away from it for a while
                    self._mark_dead(b, str(e))
                raise
            finally:
                tokens.close()
                with self._lock:
                    self.in_flight[id(b)] -= 1
                    if probe:
                        self.probing.discard(id(b))
        raise BackendError("no LM backend could take the request: " + "; ".join(self.errors.values()))

    def _mark_alive(self, b: RemoteLM) -> None:
        with self._lock:
            self.dead_until[id(b)] = 0.0


def connect(base_urls: str, api_key: str | None, model: str, sampling: SamplingParams | None = None,
            check: bool = True, family: ModelFamily | None = None,
            require_reachable: bool = True) -> BackendPool:
    """`--llm_base_url` (comma-separated URLs) -> a checked pool of backends serving `model` (of `family`,
    None: CosyVoice2); `require_reachable` as for `BackendPool.check`."""
    urls = [u.strip() for u in base_urls.split(",") if u.strip()]
    pool = BackendPool([RemoteLM(u, api_key, model, sampling, family=family) for u in urls])
    if check:
        pool.check(require_reachable)
    return pool
