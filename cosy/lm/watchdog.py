"""The token clock of LM streams: a stream that brings no token in time is closed, whatever bytes it sends.

httpx's read timeout counts bytes, and a backend sends bytes that are not tokens: our keepalive middleware's SSE
comments while a request waits in vLLM's queue (`cosy.vllm_plugin.keepalive`), or a broken proxy's keep-alives.
So each stream gets a deadline, moved by tokens only: before the first token `queue_timeout` (queued for a
while is not stalled; comments prove the server alive, not the engine), between tokens `stall_timeout`. While
the caller holds a token (flow and HiFT run between reads) the clock stops. One thread watches every stream of
the process and closes a late one's response, which ends its read with an error; `expired` tells why. A
one-job worker also has it close its streams when the job is cancelled (`abort_when`; `cancelled` tells):
a request that waits in the backend's queue reads no token that would show the cancel. A closed stream's
read ends at its next bytes (a queued request gets a keep-alive every second).

    watch = WATCHDOG.watch(stream.response.close, time.monotonic() + queue_timeout)
    for token in ...:
        watch.pause(); yield token; watch.restart(stall_timeout)
    watch.done()
"""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable

TICK = 0.2  # seconds between checks: a late stream is closed at most this late
# The clock's defaults, here and not beside the client (cosy.lm.remote): app.py's flags read them without
# importing openai, which an app whose LM is embedded never needs (bench/startup.py --app)
DEFAULT_STALL_TIMEOUT = 5.0  # seconds without a token; app.py's --llm_stall_timeout
DEFAULT_QUEUE_TIMEOUT = 60.0  # seconds to the first token while the backend says queued; --llm_queue_timeout


class Watch:
    """One stream's deadline (time.monotonic()); `expired` once the watchdog closed it."""

    def __init__(self, dog: "Watchdog", close: Callable[[], None], deadline: float):
        self.dog, self.close, self.deadline = dog, close, deadline
        self.expired = self.cancelled = False

    def pause(self) -> None:
        self.deadline = math.inf

    def restart(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def done(self) -> None:
        self.dog._drop(self)


class Watchdog:
    def __init__(self) -> None:
        self._watches: set[Watch] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._abort = None  # an Event: while it is set, every stream is closed (`abort_when`)

    def abort_when(self, event) -> None:
        """Close every watched stream while `event` (threading or multiprocessing) is set: the process's one
        job was cancelled."""
        self._abort = event

    def watch(self, close: Callable[[], None], deadline: float) -> Watch:
        w = Watch(self, close, deadline)
        with self._lock:
            self._watches.add(w)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, daemon=True, name="lm-watchdog")
                self._thread.start()
        return w

    def _drop(self, w: Watch) -> None:
        with self._lock:
            self._watches.discard(w)

    def _run(self) -> None:
        while True:
            time.sleep(TICK)
            now, abort = time.monotonic(), self._abort is not None and self._abort.is_set()
            with self._lock:
                late = [w for w in self._watches if abort or w.deadline < now]
                self._watches.difference_update(late)
                if not self._watches and not late:
                    self._thread = None
                    return
            for w in late:
                w.cancelled, w.expired = abort, not abort
                try:
                    w.close()
                except Exception:  # closing a stream that already ended
                    pass


WATCHDOG = Watchdog()  # one per process
