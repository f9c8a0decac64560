"""Run a manifest through a frontend's worker pool: many lines in flight, each prompt's features once.

The lines go through `FrontendService.synthesize`, the path every server surface takes (saved voices
resolved, the LM budget checked, the worker pool's queue, the embedded LM or the backends), with
`in_flight` lines at once: enough to keep every worker's batch (and so the backend's) full. A line whose
prompt_wav another line already used gets that prompt's features from memory (computed once, in a
worker). Busy and unavailable answers (a backend restarting, a worker replaced) are retried with backoff;
other errors fail the line, whose reason goes to the results file, and the rest goes on.
"""
from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path

from cosy.batch.manifest import BadLine, BatchItem
from cosy.batch.progress import Progress
from cosy.batch.results import Result, Results
from cosy.errors import CosyError
from cosy.frontend.audio_out import OutputAudio
from cosy.frontend.encoding import make_encoder
from cosy.frontend.service import FrontendService
from cosy.pipeline.request import SynthesisRequest
from cosy.prompt.encoder import PromptFeatures


def transient(e: CosyError) -> bool:
    """Busy (429) or unavailable (503: a backend restarting, a worker replaced): worth another try."""
    return e.status in (429, 503)


@dataclass
class Summary:
    ok: int = 0  # this run
    failed: int = 0  # this run
    skipped: int = 0  # complete before this run
    audio_s: float = 0.0  # this run's
    wall_s: float = 0.0
    aborted: str | None = None  # why the run stopped early (the output folder cannot be written)


class _Prompts:
    """Prompt features by file (path, size, mtime), each computed once however many lines share it."""

    def __init__(self, service: FrontendService):
        self.service = service
        self._lock = threading.Lock()
        self._entries: dict[tuple, tuple[threading.Lock, list]] = {}

    def features(self, path: Path) -> PromptFeatures:
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
        with self._lock:
            lock, slot = self._entries.setdefault(key, (threading.Lock(), []))
        with lock:  # the other lines of this prompt wait for the first one's computation
            if not slot:
                try:
                    slot.append(self.service.pool.prompt_features(str(path)))
                except CosyError as e:
                    if transient(e):
                        raise  # transient: the next line computes it
                    slot.append(e)
            if isinstance(slot[0], CosyError):
                raise slot[0]
            return slot[0]


class BatchRunner:
    def __init__(self, service: FrontendService, results: Results, in_flight: int, retries: int = 3):
        self.service, self.results = service, results
        self.in_flight, self.retries = max(1, in_flight), retries
        self._prompts = _Prompts(service)
        self._stop = threading.Event()
        self._summary = Summary()
        self._lock = threading.Lock()

    def run(self, entries: list[BatchItem | BadLine], progress: Progress | None = None) -> Summary:
        start = time.monotonic()
        s = self._summary
        todo: list[BatchItem] = []
        for e in entries:
            if isinstance(e, BadLine):
                self.results.add(Result(e.id, e.line, "failed", error=e.error))
                s.failed += 1
            elif self.results.done(e.id, e.file_name, e.line):
                s.skipped += 1
            else:
                todo.append(e)
        progress = progress or Progress(len(entries), bar=False, every=float("inf"))
        progress.skipped = s.skipped
        for _ in range(s.failed):
            progress.step(failed=True)
        work: queue.Queue = queue.Queue(maxsize=2 * self.in_flight)
        threads = [threading.Thread(target=self._work, args=(work, progress), name=f"batch-{i}", daemon=True)
                   for i in range(min(self.in_flight, len(todo)))]
        for t in threads:
            t.start()
        try:
            for item in todo:
                while not self._stop.is_set():
                    try:
                        work.put(item, timeout=0.5)
                        break
                    except queue.Full:
                        continue
        finally:
            for _ in threads:
                work.put(None)
            for t in threads:
                t.join()
            progress.close()
        s.wall_s = time.monotonic() - start
        return s

    @property
    def summary(self) -> Summary:
        return self._summary

    def stop(self, reason: str) -> None:
        with self._lock:
            self._summary.aborted = self._summary.aborted or reason
        self._stop.set()

    def _work(self, work: queue.Queue, progress: Progress) -> None:
        while (item := work.get()) is not None:
            if self._stop.is_set():
                continue
            try:
                seconds = self._one(item)
            except CosyError as e:
                kind = getattr(e, "kind", type(e).__name__)  # a worker's error keeps its class name
                self.results.add(Result(item.id, item.line, "failed", error=f"{kind}: {e}"))
                with self._lock:
                    self._summary.failed += 1
                progress.step(failed=True)
            except OSError as e:  # the output folder: full, read-only, gone; every later line would fail too
                self.stop(f"cannot write {self.results.dir}: {e}")
            else:
                self.results.add(Result(item.id, item.line, "ok", round(seconds, 3), item.file_name))
                with self._lock:
                    self._summary.ok += 1
                    self._summary.audio_s += seconds
                progress.step(seconds)

    def _request(self, req: SynthesisRequest) -> SynthesisRequest:
        if req.prompt_wav is None:
            return req
        return replace(req, voice=self._prompts.features(Path(req.prompt_wav)), prompt_wav=None)

    def _one(self, item: BatchItem) -> float:
        """Synthesize one line into its file; the audio's duration in seconds."""
        for attempt in range(self.retries + 1):
            try:
                result = self.service.synthesize(self._request(item.request), "batch")
                break
            except CosyError as e:
                if not transient(e) or attempt == self.retries or self._stop.is_set():
                    raise
                time.sleep(min(30.0, e.retry_after or 2.0 ** attempt))
        out = OutputAudio(result.sample_rate, item.sample_rate)
        audio = out.push(result.audio)
        enc = make_encoder(item.format, item.sample_rate, streaming=False)
        data = enc.encode(audio) + enc.encode(out.finish()) + enc.finish()
        part = self.results.part_path(item.file_name)
        with open(part, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        self.results.commit(item.file_name)
        return len(result.audio) / result.sample_rate
