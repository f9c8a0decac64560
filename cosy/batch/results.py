"""The output folder of a batch: audio files named by id, written whole or not at all, and the results file.

The results file is JSON Lines, one record per line of the current manifest: `id`, `line`, `status` ("ok" |
"failed"), `seconds` (of audio), `file`, `error`, `request` (a digest of what the line asked for,
`BatchItem.digest`), and for a line that asks for subtitles `subtitles` (the subtitle file's name) and
`sentences` (`SentenceTiming.to_dict()` of each, which the file's cues show). While a run goes on, each
finished line is appended and flushed to disk at once; at the start and the end of a run the file is
rewritten (atomically) with the last record of each line of the manifest as it is now (the records of lines
since removed or fixed go), so a killed run loses at most the line being appended. An audio file appears
under its final name only when whole and recorded: it is written as `.ID.FORMAT.part`, its subtitle file
(if asked) written whole under its final name, its record appended, then the audio renamed, so a finished
line has both; a part left by a killed run is removed when its line comes up again. A line recorded ok for
another request (an edited line) is done again.
"""
from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import soundfile as sf

from cosy.batch.manifest import BatchItem, record_key
from cosy.pipeline.subtitles import subtitles
from cosy.pipeline.timing import SentenceTiming

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
    # only for a line that asks for subtitles (left out of the record otherwise, so other records keep their shape)
    subtitles: str | None = None  # the subtitle file's name
    sentences: list[dict] | None = None  # SentenceTiming.to_dict() of each, in order

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
              and all(isinstance(v, (str, type(None))) for v in (r.file, r.error, r.request, r.subtitles))
              and (r.sentences is None or isinstance(r.sentences, list)
                   and all(isinstance(s, dict) for s in r.sentences)))
        return r if ok else None

    def to_json(self) -> str:
        """One line of the results file (`subtitles` and `sentences` only where the line asked for subtitles)."""
        obj = asdict(self)
        for name in ("subtitles", "sentences"):
            if obj[name] is None:
                del obj[name]
        return json.dumps(obj, ensure_ascii=False)


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
        """"done": recorded ok for this very request with its files there, or its audio there and no record
        (the results file was lost: the file is whole, so it is recorded now; unless the line asks for
        subtitles, whose sentences went with the record); "changed": recorded ok for another request (the
        line was edited since: its old files go, the line is done again); "todo"."""
        audio = self.dir / item.file_name
        for name in (item.file_name, item.subtitle_name):  # a killed run's (only this shard touches its ids)
            if name:
                self.part_path(name).unlink(missing_ok=True)
        r = self.records.get(item.id)
        if r is not None and r.status == "ok" and r.request is not None and r.request != item.digest:
            for name in (r.file, r.subtitles):
                if name and name.rsplit(".", 1)[0] == item.id:  # ours: ID.FORMAT, named by this line's id
                    (self.dir / name).unlink(missing_ok=True)
            return "changed"
        subtitled = item.subtitles is None or (r is not None and r.subtitles == item.subtitle_name
                                               and (self.dir / item.subtitle_name).exists())
        if r is not None and r.status == "ok" and r.file == item.file_name and audio.exists() and subtitled:
            return "done"
        if r is not None or not audio.exists() or item.subtitles:
            return "todo"  # failed before, or recorded but a file is gone (deleted): make it again
        try:
            seconds = sf.info(str(audio)).duration
        except (RuntimeError, sf.LibsndfileError):
            seconds = 0.0  # a format libsndfile does not read (aac): whole all the same
        self.add(Result(item.id, item.line, "ok", round(seconds, 3), item.file_name, request=item.digest))
        return "done"

    def part_path(self, file_name: str) -> Path:
        return self.dir / f".{file_name}{PART}"

    def write(self, item: BatchItem, data: bytes, seconds: float, sentences: Sequence[SentenceTiming] = ()) -> None:
        """The line's audio, whole or not at all: the part written and synced, its subtitle file (if the line
        asks for one: from `sentences`) written whole in place, its record appended, then the audio renamed
        into place (atomic on one filesystem), so a line whose audio is there has its subtitles too. OSError
        (a full disk ...) leaves no part behind."""
        parts = [self.part_path(item.file_name)]
        try:
            _write_synced(parts[0], data)
            timings = None
            if item.subtitles:
                parts.append(self.part_path(item.subtitle_name))
                _write_synced(parts[1], subtitles(sentences, item.subtitles).encode("utf-8"))
                os.replace(parts[1], self.dir / item.subtitle_name)
                timings = [s.to_dict() for s in sentences]
            self.add(Result(item.id, item.line, "ok", round(seconds, 3), item.file_name, request=item.digest,
                            subtitles=item.subtitle_name, sentences=timings))
            os.replace(parts[0], self.dir / item.file_name)
        except BaseException:
            for part in parts:
                part.unlink(missing_ok=True)
            raise

    def add(self, result: Result) -> None:
        with self._lock:
            self.records[result.key] = result
            if self._file is not None:
                self._file.write(result.to_json() + "\n")
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
                    f.write(r.to_json() + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
