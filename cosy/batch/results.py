"""The output folder of a batch: audio files named by id, written whole or not at all, and the results file.

The results file is JSON Lines, one record per line of the current manifest: `id`, `line`, `status` ("ok" |
"failed"), `seconds` (of audio), `file`, `error`, `request` (a digest of what the line asked for,
`BatchItem.digest`). While a run goes on, each finished line is appended and flushed to disk at once; at the
start and the end of a run the file is rewritten (atomically) with the last record of each line of the
manifest as it is now (the records of lines since removed or fixed go), so a killed run loses at most the
line being appended. An audio file appears under its final name only when whole and recorded: it is written
as `.ID.FORMAT.part`, its record appended, then it is renamed; a part left by a killed run is removed when its
line comes up again. A line recorded ok for another request (an edited line) is done again.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Collection
from dataclasses import asdict, dataclass
from pathlib import Path

import soundfile as sf

from cosy.batch.manifest import BatchItem, record_key

PART = ".part"
STATUSES = ("ok", "failed")


@dataclass
class Result:
    id: str | None
    line: int
    status: str  # "ok" | "failed"
    seconds: float = 0.0  # of audio
    file: str | None = None
    error: str | None = None
    request: str | None = None  # the line's request digest (None in records of older versions: trusted)

    @property
    def key(self) -> str:
        """Records are per line's id; a line without a usable id is known by its number."""
        return record_key(self.id, self.line)

    @classmethod
    def parse(cls, raw: bytes) -> "Result | None":
        """A record read back, or None for what is not one (the line a killed run was appending, cut
        anywhere, even inside a character; a line someone edited)."""
        try:
            obj = json.loads(raw)
            r = cls(**obj) if isinstance(obj, dict) else None
        except (ValueError, TypeError, RecursionError):  # UnicodeDecodeError is a ValueError
            return None
        ok = (r is not None and isinstance(r.id, (str, type(None))) and type(r.line) is int
              and r.status in STATUSES and isinstance(r.seconds, (int, float)) and not isinstance(r.seconds, bool)
              and all(isinstance(v, (str, type(None))) for v in (r.file, r.error, r.request)))
        return r if ok else None


class Results:
    """The results of one output folder (`name`: the file, one per shard so shards never share a file)."""

    def __init__(self, out_dir: Path, name: str = "results.jsonl"):
        self.dir = out_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / name
        self.records: dict[str, Result] = {}
        self._lock = threading.Lock()
        self._file = None

    def open(self, keep: Collection[str] | None = None) -> "Results":
        """Read what earlier runs recorded for the keys in `keep` (the current manifest's lines: records of
        lines removed, or of a line that had no usable id and has one now, are dropped; None keeps all),
        drop partial files of a killed rewrite, and start appending."""
        if self.path.exists():
            with open(self.path, "rb") as f:
                for raw in f:
                    r = Result.parse(raw)
                    if r is not None and (keep is None or r.key in keep):
                        self.records[r.key] = r
        for tmp in self.dir.glob(f".{self.path.name}.*{PART}"):  # a rewrite that was killed
            tmp.unlink(missing_ok=True)
        self._rewrite()
        self._file = open(self.path, "a", encoding="utf-8")
        return self

    def state(self, item: BatchItem) -> str:
        """"done": recorded ok for this very request with its file there, or its file there and no record
        (the results file was lost: the file is whole, so it is recorded now); "changed": recorded ok for
        another request (the line was edited since: its old file goes, the line is done again); "todo"."""
        audio = self.dir / item.file_name
        self.part_path(item.file_name).unlink(missing_ok=True)  # a killed run's (only this shard touches its ids)
        r = self.records.get(item.id)
        if r is not None and r.status == "ok" and r.request is not None and r.request != item.digest:
            if r.file and r.file.rsplit(".", 1)[0] == item.id:  # ours: ID.FORMAT, named by this line's id
                (self.dir / r.file).unlink(missing_ok=True)
            return "changed"
        if r is not None and r.status == "ok" and r.file == item.file_name and audio.exists():
            return "done"
        if r is not None or not audio.exists():
            return "todo"  # failed before, or recorded but its file is gone (deleted): make it again
        try:
            seconds = sf.info(str(audio)).duration
        except (RuntimeError, sf.LibsndfileError):
            seconds = 0.0  # a format libsndfile does not read (aac): whole all the same
        self.add(Result(item.id, item.line, "ok", round(seconds, 3), item.file_name, request=item.digest))
        return "done"

    def part_path(self, file_name: str) -> Path:
        return self.dir / f".{file_name}{PART}"

    def write(self, item: BatchItem, data: bytes, seconds: float) -> None:
        """The line's audio, whole or not at all: the part written and synced, its record appended, then
        renamed into place (atomic on one filesystem). OSError (a full disk ...) leaves no part behind."""
        part = self.part_path(item.file_name)
        try:
            with open(part, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            self.add(Result(item.id, item.line, "ok", round(seconds, 3), item.file_name, request=item.digest))
            os.replace(part, self.dir / item.file_name)
        except BaseException:
            part.unlink(missing_ok=True)
            raise

    def add(self, result: Result) -> None:
        with self._lock:
            self.records[result.key] = result
            if self._file is not None:
                self._file.write(json.dumps(asdict(result), ensure_ascii=False) + "\n")
                self._file.flush()
                os.fsync(self._file.fileno())

    def close(self) -> None:
        """Stop appending and rewrite the file with the last record of each line (OSError if it cannot be
        written: the appended file stays as it was, and the next run reads it)."""
        with self._lock:
            if self._file is not None:
                try:
                    self._file.close()
                except OSError:
                    pass  # what it held was flushed record by record; the rewrite below says if the disk fails
                self._file = None
            self._rewrite()

    def _rewrite(self) -> None:
        records = sorted(self.records.values(), key=lambda r: r.line)
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{self.path.name}.", suffix=PART)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                for r in records:
                    f.write(json.dumps(asdict(r), ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
