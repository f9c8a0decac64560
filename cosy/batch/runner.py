"""Run a manifest through a frontend's worker pool: many lines in flight, each prompt's features once.

The lines go through `FrontendService.synthesize`, the path every server surface takes (saved voices
resolved, the LM budget checked, the worker pool's queue, the embedded LM or the backends), with
`in_flight` lines at once: enough to keep every worker's batch (and so the backend's) full. A line whose
prompt_wav another line already used gets that prompt's features from memory (computed once, in a
worker). Busy and unavailable answers (a backend restarting, a worker replaced) are retried with backoff;
other errors fail the line, whose reason goes to the results file, and the rest goes on; an unexpected
error fails its line too, with its traceback on stderr. `stop` (SIGTERM, Ctrl-C, an output folder that
cannot be written, a thread that failed) cancels the lines in flight at once and starts no other.
"""
from __future__ import annotations

import queue
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from cosy.batch.manifest import BadLine, BatchItem
from cosy.batch.progress import Progress
from cosy.batch.results import Result, Results
from cosy.errors import Cancelled, CosyError, JobError
from cosy.frontend.audio_out import OutputAudio
from cosy.frontend.encoding import make_encoder
from cosy.frontend.service import FrontendService
from cosy.pipeline.request import SynthesisError, SynthesisRequest
from cosy.pipeline.timing import SentenceTiming
from cosy.prompt.encoder import PromptFeatures

POLL = 0.2  # s: how often an idle thread looks at the queue and the stop flag


def transient(e: CosyError) -> bool:
    """Busy (429) or unavailable (503: a backend restarting, a worker replaced): worth another try."""
    return e.status in (429, 503)


@dataclass
class Summary:
    ok: int = 0  # this run
    failed: int = 0  # this run: the bad lines and the lines that failed
    skipped: int = 0  # complete before this run
    redone: int = 0  # of `ok`: lines recorded for another request before (edited since)
    audio_s: float = 0.0  # this run's
    wall_s: float = 0.0
    aborted: str | None = None  # why the run stopped early (the output folder cannot be written, a signal)


class _Prompts:
    """Prompt features by file (path, size, mtime), each computed once however many lines share it."""

    def __init__(self, service: FrontendService):
        self.service = service
        self._lock = threading.Lock()
        self._entries: dict[tuple, tuple[threading.Lock, list]] = {}

    def features(self, path: Path, cancelled: threading.Event) -> PromptFeatures:
        try:
            st, resolved = path.stat(), str(path.resolve())
        except OSError as e:  # gone (or unreadable) since the manifest was checked: this line's problem
            raise SynthesisError(f"prompt_wav '{path}' cannot be read: {e.strerror or e}") from None
        key = (resolved, st.st_size, st.st_mtime_ns)
        with self._lock:
            lock, slot = self._entries.setdefault(key, (threading.Lock(), []))
        with lock:  # the other lines of this prompt wait for the first one's computation
            if not slot:
                try:
                    slot.append(self.service.pool.prompt_features(resolved, cancelled))
                except CosyError as e:
                    if transient(e) or isinstance(e, Cancelled):
                        raise  # the next line computes it
                    slot.append(e)
            if isinstance(slot[0], CosyError):
                raise _naming(slot[0], resolved, str(path))
            return slot[0]


def _naming(e: CosyError, resolved: str, path: str) -> CosyError:
    """A prompt's cached error as one line's: the file under the name that line gave it."""
    return JobError(getattr(e, "kind", type(e).__name__), str(e).replace(resolved, path), e.status, e.retry_after)


class BatchRunner:
    def __init__(self, service: FrontendService, results: Results, in_flight: int, retries: int = 3):
        self.service, self.results = service, results
        self.in_flight, self.retries = max(1, in_flight), retries
        self._stop = threading.Event()
        self._fed = threading.Event()  # every line is queued: an idle thread with an empty queue ends
        self._cancels: set[threading.Event] = set()  # the lines in flight's (the pool sets one when its job ends)
        self._prompts = _Prompts(service)
        self._summary = Summary()
        self._lock = threading.Lock()
        self._changed: set[str] = set()

    def run(self, entries: list[BatchItem | BadLine], progress: Progress | None = None) -> Summary:
        start = time.monotonic()
        s = self._summary
        progress = progress or Progress(len(entries), bar=False, every=float("inf"))
        todo: list[BatchItem] = []
        try:
            for e in entries:
                if isinstance(e, BadLine):
                    self.results.add(Result(e.id, e.line, "failed", error=e.error))
                    s.failed += 1
                    continue
                state = self.results.state(e)
                if state == "done":
                    s.skipped += 1
                    continue
                if state == "changed":
                    self._changed.add(e.id)
                todo.append(e)
        except OSError as e:
            self.stop(f"cannot write {self.results.dir}: {e}")
            todo = []
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
                if not self._put(work, item, threads):
                    break
        except BaseException:  # KeyboardInterrupt where no handler stops us first: the lines in flight too
            self.stop("interrupted")
            raise
        finally:
            self._fed.set()
            for t in threads:
                t.join()
            progress.close()
        s.wall_s = time.monotonic() - start
        return s

    def _put(self, work: queue.Queue, item: BatchItem, threads: list[threading.Thread]) -> bool:
        """Queue `item` unless the run stops first; False once it has stopped."""
        while not self._stop.is_set():
            if not any(t.is_alive() for t in threads):  # cannot happen: a failing thread stops the run
                self.stop("every batch thread has ended")
                break
            try:
                work.put(item, timeout=0.5)
                return True
            except queue.Full:
                continue
        return False

    @property
    def summary(self) -> Summary:
        return self._summary

    def stop(self, reason: str) -> None:
        """Stop the run: the lines in flight are cancelled, no other starts; the first reason is kept."""
        with self._lock:
            self._summary.aborted = self._summary.aborted or reason
            self._stop.set()
            cancels = list(self._cancels)
        for cancel in cancels:
            cancel.set()

    def _work(self, work: queue.Queue, progress: Progress) -> None:
        try:
            while not self._stop.is_set():
                try:
                    item = work.get(timeout=POLL)
                except queue.Empty:
                    if self._fed.is_set() and work.empty():  # once fed, the queue only shrinks
                        return
                    continue
                self._line(item, progress)
        except BaseException as e:  # a bug here: reported, and the run stops rather than waits for this thread
            traceback.print_exc()
            self.stop(f"a batch thread failed: {type(e).__name__}: {e}")

    def _line(self, item: BatchItem, progress: Progress) -> None:
        try:
            data, seconds, sentences = self._make(item)
        except CosyError as e:
            if self._stop.is_set() and (isinstance(e, Cancelled) or transient(e)):
                return  # stopped (the pool may be shutting down): the line is left for the next run
            kind = getattr(e, "kind", type(e).__name__)  # a worker's error keeps its class name
            self._failed(item, f"{kind}: {e}", progress)
            return
        except Exception as e:  # a bug, not the line's: this line fails with the reason, the rest goes on
            print(f"batch: line {item.line} ({item.id}) failed unexpectedly:", flush=True,
                  file=sys.stderr)
            traceback.print_exc()
            self._failed(item, f"internal error: {type(e).__name__}: {e}", progress)
            return
        try:
            self.results.write(item, data, seconds, sentences)
        except OSError as e:  # the output folder: full, read-only, gone; every later line would fail too
            self.stop(f"cannot write {self.results.dir}: {e}")
            return
        with self._lock:
            self._summary.ok += 1
            self._summary.redone += item.id in self._changed
            self._summary.audio_s += seconds
        progress.step(seconds)

    def _failed(self, item: BatchItem, error: str, progress: Progress) -> None:
        try:
            self.results.add(Result(item.id, item.line, "failed", error=error, request=item.digest))
        except OSError as e:
            self.stop(f"cannot write {self.results.dir}: {e}")
            return
        with self._lock:
            self._summary.failed += 1
        progress.step(failed=True)

    @contextmanager
    def _cancel(self) -> Iterator[threading.Event]:
        """A cancel event for one job of the pool (which sets it when the job ends), set by `stop`."""
        event = threading.Event()
        with self._lock:
            self._cancels.add(event)
            if self._stop.is_set():
                event.set()
        try:
            yield event
        finally:
            with self._lock:
                self._cancels.discard(event)

    def _request(self, req: SynthesisRequest) -> SynthesisRequest:
        if req.prompt_wav is None:
            return req
        with self._cancel() as cancel:
            return replace(req, voice=self._prompts.features(Path(req.prompt_wav), cancel), prompt_wav=None)

    def _make(self, item: BatchItem) -> tuple[bytes, float, list[SentenceTiming]]:
        """Synthesize one line (cancelled by `stop`): its file's bytes, the audio's duration in seconds and
        its sentences' timings (ms, which the output rate does not change)."""
        for attempt in range(self.retries + 1):
            try:
                req = self._request(item.request)
                with self._cancel() as cancel:
                    result = self.service.synthesize(req, "batch", cancel)
                    if cancel.is_set():  # a cancelled job's stream ends quietly, with the audio made so far
                        raise Cancelled("stopped")
                break
            except CosyError as e:
                if not transient(e) or attempt == self.retries or self._stop.is_set():
                    raise
                if self._stop.wait(min(30.0, e.retry_after or 2.0 ** attempt)):
                    raise Cancelled("stopped") from None
        out = OutputAudio(result.sample_rate, item.sample_rate)
        audio = out.push(result.audio)
        enc = make_encoder(item.format, item.sample_rate, streaming=False)
        try:
            data = enc.encode(audio) + enc.encode(out.finish()) + enc.finish()
        finally:
            enc.close()
        return data, len(result.audio) / result.sample_rate, result.sentences
