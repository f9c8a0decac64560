"""The output folder of a batch: audio files named by id, written whole or not at all, and the results file.

The results file is JSON Lines, one record per manifest line: `id`, `line`, `status` ("ok" | "failed"),
`seconds` (of audio), `file`, `error`. While a run goes on, each finished line is appended and flushed to
disk at once; at the start and the end of a run the file is rewritten (atomically) with the last record of
each line, so a killed run loses at most the line being appended, and that line's record is recovered from
its audio file. An audio file appears under its final name only when whole: it is written as
`.ID.FORMAT.part` and renamed; a part left by a killed run is removed when its line comes up again.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import soundfile as sf

PART = ".part"


@dataclass
class Result:
    id: str | None
    line: int
    status: str  # "ok" | "failed"
    seconds: float = 0.0  # of audio
    file: str | None = None
    error: str | None = None

    @property
    def key(self) -> str:
        """Records are per line's id; a line without a usable id is known by its number."""
        return self.id if self.id is not None else f"line:{self.line}"


class Results:
    """The results of one output folder (`name`: the file, one per shard so shards never share a file)."""

    def __init__(self, out_dir: Path, name: str = "results.jsonl"):
        self.dir = out_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = out_dir / name
        self.records: dict[str, Result] = {}
        self._lock = threading.Lock()
        self._file = None

    def open(self) -> "Results":
        """Read what earlier runs recorded, drop their partial files, and start appending."""
        if self.path.exists():
            for raw in self.path.read_text(encoding="utf-8").splitlines():
                try:
                    r = Result(**json.loads(raw))
                except (ValueError, TypeError):
                    continue  # the line a killed run was appending
                self.records[r.key] = r
        for tmp in self.dir.glob(f".{self.path.name}.*{PART}"):  # a rewrite that was killed
            tmp.unlink(missing_ok=True)
        self._rewrite()
        self._file = open(self.path, "a", encoding="utf-8")
        return self

    def done(self, item_id: str, file_name: str, line: int) -> bool:
        """Whether `item_id` is complete: recorded ok with its file there, or its file there unrecorded (the
        run was killed between the rename and the record: the file is whole, so it is recorded now)."""
        audio = self.dir / file_name
        self.part_path(file_name).unlink(missing_ok=True)  # a killed run's (only this shard touches its ids)
        r = self.records.get(item_id)
        if r is not None and r.status == "ok" and r.file == file_name and audio.exists():
            return True
        if r is not None and r.status == "ok" or not audio.exists():
            return False  # recorded but its file is gone (deleted): make it again
        try:
            seconds = sf.info(str(audio)).duration
        except (RuntimeError, sf.LibsndfileError):
            seconds = 0.0  # a format libsndfile does not read (aac): whole all the same
        self.add(Result(item_id, line, "ok", round(seconds, 3), file_name))
        return True

    def part_path(self, file_name: str) -> Path:
        return self.dir / f".{file_name}{PART}"

    def commit(self, file_name: str) -> None:
        """Move a finished part into place (atomic on one filesystem)."""
        part = self.part_path(file_name)
        with open(part, "rb") as f:
            os.fsync(f.fileno())
        os.replace(part, self.dir / file_name)

    def add(self, result: Result) -> None:
        with self._lock:
            self.records[result.key] = result
            if self._file is not None:
                self._file.write(json.dumps(asdict(result), ensure_ascii=False) + "\n")
                self._file.flush()
                os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
            self._rewrite()

    def _rewrite(self) -> None:
        records = sorted(self.records.values(), key=lambda r: r.line)
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=f".{self.path.name}.", suffix=PART)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(asdict(r), ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
