"""One memory budget for the streaming flow state (`cosy.flow.incremental.FlowState`).

Two kinds of holders share it: live streams (the state of their finished chunks, dropped when the stream
ends) and an LRU of saved voices' prompt state (the prompt chunks no target token can reach), which seeds
the first chunk of every request for that voice. What does not fit is recomputed, as without a cache: a
stream whose state would overflow the budget drops it; a voice is not stored when it would take more than
`voice_share` of the budget (older voices are evicted first).

Cost (fp32, CosyVoice2's 56 attention layers x 512 wide, 10 ODE steps x 2 CFG rows): about 4.4 MiB per
mel frame, 220 MiB per second of audio or prompt; half in bf16.
"""
from __future__ import annotations

import threading
from collections import OrderedDict, deque

from cosy.flow.incremental import FlowState

MIB = 1 << 20


class StateBudget:
    def __init__(self, budget_bytes: int, voice_share: float = 0.5):
        self.budget, self.voice_cap = int(budget_bytes), int(budget_bytes * voice_share)
        self._lock = threading.Lock()
        self._streams: dict[int, int] = {}  # owner id -> bytes
        self._voices: OrderedDict[str, FlowState] = OrderedDict()
        self._voice_bytes = 0
        self._released: deque[int] = deque()  # owners let go of, not yet dropped (see `release`)

    def _drop_released(self) -> None:
        """Under the lock: forget what released owners held."""
        while self._released:
            self._streams.pop(self._released.popleft(), None)

    def used(self) -> int:
        with self._lock:
            self._drop_released()
            return self._voice_bytes + sum(self._streams.values())

    def voice(self, key: str) -> FlowState | None:
        with self._lock:
            state = self._voices.get(key)
            if state is not None:
                self._voices.move_to_end(key)
            return state

    def put_voice(self, key: str, state: FlowState) -> bool:
        n = state.nbytes
        with self._lock:
            self._drop_released()
            if n > self.voice_cap or key in self._voices:
                return key in self._voices
            while self._voices and (self._voice_bytes + n > self.voice_cap
                                    or self._voice_bytes + n + sum(self._streams.values()) > self.budget):
                _, old = self._voices.popitem(last=False)
                self._voice_bytes -= old.nbytes
            if self._voice_bytes + n + sum(self._streams.values()) > self.budget:
                return False
            self._voices[key] = state
            self._voice_bytes += n
            return True

    def charge(self, owner: int, nbytes: int) -> bool:
        """Set what `owner` holds; False (and nothing held) when it would overflow the budget."""
        with self._lock:
            self._drop_released()
            others = self._voice_bytes + sum(b for o, b in self._streams.items() if o != owner)
            if others + nbytes > self.budget:
                self._streams.pop(owner, None)
                return False
            self._streams[owner] = nbytes
            return True

    def room(self) -> int:
        """Bytes not held by anyone (what a batch of new states may take without overflowing)."""
        return max(0, self.budget - self.used())

    def release(self, owner: int) -> None:
        """Let go of what `owner` holds; the next call drops it. Takes no lock: streams release from
        finalizers (a stream's `__del__`, a generator's `finally`), which the garbage collector runs at any
        allocation, also inside one of these methods on the same thread, where taking the lock would wait
        for ever (the CI's stuck worker)."""
        self._released.append(owner)
