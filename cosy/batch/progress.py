"""Progress of a batch: a tqdm bar on a terminal (lines, audio hours, rate, ETA), plain log lines otherwise."""
from __future__ import annotations

import sys
import threading
import time
from typing import TextIO


class Progress:
    """Counts lines as they finish (`step`); `every` seconds between log lines when not on a terminal."""

    def __init__(self, total: int, skipped: int = 0, stream: TextIO = sys.stderr, every: float = 10.0,
                 bar: bool | None = None):
        self.total, self.skipped = total, skipped
        self.done = self.failed = 0
        self.audio_s = 0.0
        self.stream, self.every = stream, every
        self.started = self._logged = time.monotonic()
        self._lock = threading.Lock()
        self._bar = None
        if bar if bar is not None else stream.isatty():
            from tqdm import tqdm
            self._bar = tqdm(total=total, initial=skipped, unit="line", file=stream, dynamic_ncols=True,
                             desc="batch")
            self._bar.set_postfix_str(self._postfix())

    def _postfix(self) -> str:
        return f"{self.audio_s / 3600:.3f} h audio, {self.failed} failed"

    def step(self, audio_s: float = 0.0, failed: bool = False) -> None:
        with self._lock:
            self.done += 1
            self.failed += failed
            self.audio_s += audio_s
            if self._bar is not None:
                self._bar.set_postfix_str(self._postfix(), refresh=False)
                self._bar.update(1)
            elif time.monotonic() - self._logged >= self.every:
                self._log()

    def _log(self) -> None:
        self._logged = now = time.monotonic()
        rate = self.done / max(now - self.started, 1e-9)
        left = self.total - self.skipped - self.done
        eta = f"{left / rate:.0f} s" if rate > 0 else "?"
        print(f"batch: {self.skipped + self.done}/{self.total} lines ({self.failed} failed, {self.skipped} done "
              f"before), {self.audio_s / 3600:.3f} h of audio, {rate:.2f} lines/s, ETA {eta}",
              file=self.stream, flush=True)

    def close(self) -> None:
        with self._lock:
            if self._bar is not None:
                self._bar.close()
            else:
                self._log()
