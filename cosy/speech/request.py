"""One live request inside a worker process (nano-vllm's `Sequence`, for the speech stage)."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class LiveRequest:
    id: int
    kind: str  # "synthesize" | "features"
    payload: dict
    arrival: float = field(default_factory=time.monotonic)
    cancelled: threading.Event = field(default_factory=threading.Event)
    chunks: int = 0  # flow/HiFT work items run so far
    _ended: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def end(self) -> bool:
        """True exactly once: whoever gets it sends the job's terminal message (done/error)."""
        with self._lock:
            if self._ended:
                return False
            self._ended = True
            return True
