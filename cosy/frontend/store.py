"""Bounded, pruned file stores of a frontend: nothing it writes grows without limit or outlives it.

* `DATA_DIR/uploads/`: accepted prompt uploads (content-addressed); pruned by age and total size
  (`--uploads_max_age`, `--uploads_max_mb`). Refused uploads are deleted at once (gradio_api).
* the per-process temp dir `TEMP_ROOT` (`$TMPDIR/cosy-frontend-<pid>`): `results/` (the gradio result wavs)
  and `gradio/` (gradio's own upload and cache dir, `GRADIO_TEMP_DIR`, unless set by the user); pruned by
  `--results_max_age`, `--results_max_mb`, and removed as a whole when the process exits. The process holds
  a lock on it for its life (`claim_temp_root`, `cosy.deploy.temp_root`), so the next frontend to start on
  this machine removes what a killed one left (`remove_orphaned_temp_roots`).

Pruning removes files older than `max_age`, then the oldest until the total is at most `max_bytes`; it runs
after every write into a store and every `interval` seconds in a background thread (`Pruner`).
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cosy.deploy.temp_root import TempRoot

TEMP_PREFIX = "cosy-frontend-"
_ROOT = TempRoot(TEMP_PREFIX)
TEMP_ROOT = _ROOT.path
RESULTS = TEMP_ROOT / "results"
GRADIO_TEMP = TEMP_ROOT / "gradio"


@dataclass(frozen=True)
class Bounds:
    max_age: float  # seconds
    max_bytes: int

    @classmethod
    def of(cls, max_age: float, max_mb: float) -> "Bounds":
        return cls(float(max_age), int(max_mb * 2**20))


DEFAULT_UPLOADS = Bounds.of(3600, 1024)  # --uploads_max_age, --uploads_max_mb
DEFAULT_RESULTS = Bounds.of(600, 512)  # --results_max_age, --results_max_mb


def _files(root: Path) -> list[tuple[float, int, Path]]:
    out = []
    for dirpath, _, names in os.walk(root):
        for n in names:
            p = Path(dirpath, n)
            try:
                st = p.stat()
            except OSError:
                continue  # removed meanwhile
            out.append((st.st_mtime, st.st_size, p))
    return out


def size(root: Path) -> int:
    return sum(s for _, s, _ in _files(root)) if root.is_dir() else 0


def prune(root: Path, bounds: Bounds, keep: Path | None = None, pinned: frozenset[Path] = frozenset()) -> int:
    """Remove files under `root` older than the bounds' age, then the oldest until the total fits (never
    `keep`, the file just written, nor the `pinned` ones); empty subdirectories go too. The number of bytes
    left."""
    if not root.is_dir():
        return 0
    now, left = time.time(), []
    for mtime, sz, p in _files(root):
        if now - mtime > bounds.max_age and p != keep and p not in pinned:
            p.unlink(missing_ok=True)
        else:
            left.append((mtime, sz, p))
    total = sum(sz for _, sz, _ in left)
    for mtime, sz, p in sorted(left, key=lambda t: t[0]):
        if total <= bounds.max_bytes:
            break
        if p != keep and p not in pinned:
            p.unlink(missing_ok=True)
            total -= sz
    for dirpath, dirs, names in os.walk(root, topdown=False):
        if Path(dirpath) != root and not dirs and not names:
            try:
                os.rmdir(dirpath)
            except OSError:
                pass  # a file arrived meanwhile
    return total


_pinned: frozenset[Path] = frozenset()  # this process's pinned files (`pin`)


def pin(root: Path) -> None:
    """Keep the files now under `root` for the process's life: gradio's cached copies of the WebUI's
    examples, made when the page is built, which keep their assets' old modification times (by age they
    would go at the first pass, and the examples with them). Neither a `Pruner` nor a refused upload's
    clean-up removes them: an upload of the same file is stored at the same path (content-addressed)."""
    global _pinned
    _pinned = _pinned | {p for _, _, p in _files(root)}


def pinned(path: Path) -> bool:
    return path in _pinned


class Pruner:
    """Prunes (root, bounds) pairs every `interval` seconds until `stop()`, never the `pin`ned files."""

    def __init__(self, stores: list[tuple[Path, Bounds]], interval: float = 30.0):
        self.stores, self.interval = stores, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="store-pruner")

    def start(self) -> "Pruner":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for root, bounds in self.stores:
                try:
                    prune(root, bounds, pinned=_pinned)
                except OSError:
                    pass

    def stop(self) -> None:
        self._stop.set()


def remove_temp_root() -> None:
    _ROOT.remove()


def claim_temp_root() -> Path:
    """Create TEMP_ROOT and lock it until this process ends, however it ends."""
    return _ROOT.claim()


def remove_orphaned_temp_roots(temp: Path | None = None) -> list[Path]:
    """Remove the temp roots of frontends that are gone (`TempRoot.remove_orphans`)."""
    return (_ROOT if temp is None else TempRoot(TEMP_PREFIX, temp)).remove_orphans()
