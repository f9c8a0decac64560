"""The shared pronunciation lexicon: `lexicon.tsv` in the data dir, one file every frontend on it reads.

    store = LexiconStore(data_dir / "lexicon.tsv")
    store.entries()                          # the current entries: re-read when the file changed (one stat)
    store.put("重庆", "py", "chong2 qing4")   # written atomically, seen by every frontend at its next request
    store.delete("重庆")

The file, for an operator to edit (UTF-8; blank lines and lines starting with # are ignored):

    # word <TAB> kind <TAB> value
    重庆	py	chong2 qing4
    WHO	sub	世界卫生组织
    nginx	cmu	EH1 N JH AH0 N EH1 K S

kind: py (pinyin with tone numbers), cmu (CMU phones) or sub (a replacement text); each word once; the
entries as `cosy.text.lexicon.make_entry` checks them. At most MAX_ENTRIES entries and MAX_BYTES bytes.

Loading: `entries()` looks at the file's mtime, size and inode on every call and reads it again when one
changed (a change by another frontend, or by hand, is used at the next request, without a restart). A file
that does not load (a bad line, too large) is logged with its line and the last good entries stay in use;
`status()["error"]` says what is wrong until the file is fixed. Writes (`put`, `delete`) hold the file lock
beside it, read the file afresh (refusing to write over a file that does not load: 409, fix it first), and
replace it atomically with a newer mtime, so readers see the old or the new file, never a partial one.
"""
from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

from filelock import FileLock

from cosy.errors import Conflict, NotFound, PayloadTooLarge, echo, storing
from cosy.text.lexicon import Entry, LexiconError, check_word, make_entry

log = logging.getLogger(__name__)

FILE_NAME = "lexicon.tsv"
MAX_ENTRIES = 10_000
MAX_BYTES = 1 << 20
HEADER = ("# cosy pronunciation lexicon: word<TAB>kind<TAB>value, one entry a line; kind py (pinyin with tone "
          "numbers), cmu (CMU phones) or sub (a replacement text)\n")


class LexiconFileError(LexiconError):
    """The lexicon file does not load; the message names the line."""


def parse_file(data: bytes, name: str = FILE_NAME) -> dict[str, Entry]:
    """word -> entry of a lexicon file's bytes; LexiconFileError naming the line of the first problem."""
    if len(data) > MAX_BYTES:
        raise LexiconFileError(f"{name} is {len(data)} bytes; at most {MAX_BYTES}")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise LexiconFileError(f"{name} line {line}: not UTF-8 text") from None
    out: dict[str, Entry] = {}
    for number, line in enumerate(text.split("\n"), 1):
        line = line.removesuffix("\r")
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = line.split("\t")
        where = f"{name} line {number}"
        if len(fields) != 3:
            raise LexiconFileError(f"{where}: {len(fields)} tab-separated fields; write word<TAB>kind<TAB>value")
        try:
            entry = make_entry(fields[0], fields[1].strip(), fields[2].strip(), where)
        except LexiconError as e:
            raise LexiconFileError(str(e)) from None
        if entry.word in out:
            raise LexiconFileError(f"{where}: {echo(entry.word)} is given again (each word once)")
        out[entry.word] = entry
        if len(out) > MAX_ENTRIES:
            raise LexiconFileError(f"{where}: more than {MAX_ENTRIES} entries")
    return out


def render(entries: dict[str, Entry]) -> bytes:
    """A lexicon file of `entries` (sorted by word)."""
    return (HEADER + "".join(f"{e.word}\t{e.kind}\t{e.value}\n" for _, e in sorted(entries.items()))).encode()


class LexiconStore:
    """The lexicon file of one data dir, safe to share between processes and machines (NAS)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._file_lock = FileLock(str(self.path.with_name(f".{self.path.name}.lock")))
        self._lock = threading.Lock()
        self._signature: tuple | None = None  # of the file last read (good or not); None: not read yet
        self._entries: dict[str, Entry] = {}  # the last good ones
        self._ordered: tuple[Entry, ...] = ()
        self._error: str | None = None
        self._bytes = 0

    def _stat(self) -> tuple | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev

    def entries(self) -> tuple[Entry, ...]:
        """The current entries (the last good file's), re-read if the file changed since the last call."""
        signature = self._stat()
        if signature != self._signature:
            with self._lock:
                if signature != self._signature:
                    self._load(signature)
        return self._ordered

    def _load(self, signature: tuple | None) -> None:
        self._signature = signature
        try:
            data = b"" if signature is None else self._read()
            entries = parse_file(data)
        except FileNotFoundError:
            entries, data = {}, b""
        except (LexiconFileError, OSError) as e:
            self._error = str(e)
            log.warning("the lexicon file does not load; still using its last good %d entries: %s",
                        len(self._entries), e)
            return
        self._entries, self._bytes, self._error = entries, len(data), None
        self._ordered = tuple(entries.values())

    def _read(self) -> bytes:
        with open(self.path, "rb") as f:
            return f.read(MAX_BYTES + 1)

    def status(self) -> dict:
        """{entries (the list), count, bytes, max_entries, max_bytes, error (why the file does not load, or
        None)}."""
        entries = self.entries()
        return {"entries": [e.to_dict() for e in sorted(entries, key=lambda e: e.word)], "count": len(entries),
                "bytes": self._bytes, "max_entries": MAX_ENTRIES, "max_bytes": MAX_BYTES, "error": self._error}

    def get(self, word: str) -> Entry:
        entry = {e.word: e for e in self.entries()}.get(word)
        if entry is None:
            raise NotFound(f"no lexicon entry for {echo(word)}")
        return entry

    def put(self, word: object, kind: object, value: object, create: bool = False) -> tuple[Entry, bool]:
        """Add or change the entry of `word` (`create`: only add, 409 if it exists); (entry, whether it is
        new). LexiconError (400) for a bad entry, PayloadTooLarge (413) past MAX_ENTRIES or MAX_BYTES."""
        entry = make_entry(word, kind, value, "entry")
        with self._file_lock:
            entries = self._current()
            new = entry.word not in entries
            if create and not new:
                raise Conflict(f"the lexicon has an entry for {echo(entry.word)} already: change it with PUT")
            entries[entry.word] = entry
            if len(entries) > MAX_ENTRIES:
                raise PayloadTooLarge(f"the lexicon holds {MAX_ENTRIES} entries, its limit: delete some first")
            data = render(entries)
            if len(data) > MAX_BYTES:
                raise PayloadTooLarge(f"the lexicon would be {len(data)} bytes; its limit is {MAX_BYTES}: delete "
                                      "some entries first")
            self._write(data, entries)
        return entry, new

    def delete(self, word: str) -> None:
        check_word(word, "word")
        with self._file_lock:
            entries = self._current()
            if entries.pop(word, None) is None:
                raise NotFound(f"no lexicon entry for {echo(word)}")
            self._write(render(entries), entries)

    def _current(self) -> dict[str, Entry]:
        """The file's entries read now (under the file lock); Conflict when it does not load."""
        try:
            return parse_file(self._read())
        except FileNotFoundError:
            return {}
        except LexiconFileError as e:
            raise Conflict(f"the lexicon file does not load ({e}); frontends use its last good entries: fix or "
                           "replace the file before changing entries through the API") from None

    def _write(self, data: bytes, entries: dict[str, Entry]) -> None:
        """Replace the file with `data` (of `entries`, which this process uses from now on)."""
        from cosy.deploy.data_dir import write_atomic

        before = self._stat()
        with storing("the lexicon"):
            write_atomic(self.path, data)
            after = self._stat()
            if before is not None and after is not None and after[0] <= before[0]:
                # a coarse clock: the new file must look changed to readers that compare mtimes
                os.utime(self.path, ns=(before[0] + 1, before[0] + 1))
        with self._lock:  # what this process wrote is its last good lexicon at once
            self._signature, self._entries, self._bytes, self._error = self._stat(), entries, len(data), None
            self._ordered = tuple(entries.values())


__all__ = ["FILE_NAME", "MAX_BYTES", "MAX_ENTRIES", "LexiconFileError", "LexiconStore", "parse_file", "render"]
