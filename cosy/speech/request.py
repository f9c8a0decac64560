"""One live request inside a worker process (nano-vllm's `Sequence`, for the speech stage)."""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

from cosy.errors import Cancelled


@dataclass
class LiveRequest:
    id: int
    kind: str  # "synthesize" | "duplex" | "features"
    payload: dict
    arrival: float = field(default_factory=time.monotonic)
    cancelled: threading.Event = field(default_factory=threading.Event)
    heard: bool = False  # its first audio chunk was sent (a listener's hold on less urgent work ends)
    first_text: float | None = None  # "duplex": when its first text piece came (a listener's hold starts)
    text: queue.Queue = field(default_factory=queue.Queue)  # "duplex": text pieces, None ends the text
    _ended: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def pieces(self):
        """The text pieces of a duplex job as they arrive; Cancelled once the job is cancelled."""
        while True:
            try:
                piece = self.text.get(timeout=0.1)
            except queue.Empty:
                if self.cancelled.is_set():
                    raise Cancelled("cancelled") from None
                continue
            if piece is None:
                return
            if self.first_text is None:
                self.first_text = time.monotonic()
            yield piece

    def end(self) -> bool:
        """True exactly once: whoever gets it sends the job's terminal message (done/error)."""
        with self._lock:
            if self._ended:
                return False
            self._ended = True
            return True
