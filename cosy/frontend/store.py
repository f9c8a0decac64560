"""Bounded, pruned file stores of a frontend: nothing it writes grows without limit or outlives it.

* `DATA_DIR/uploads/`: accepted prompt uploads (content-addressed); pruned by age and total size
  (`--uploads_max_age`, `--uploads_max_mb`). Refused uploads are deleted at once (gradio_api).
* the per-process temp dir `TEMP_ROOT` (`$TMPDIR/cosy-frontend-<pid>`): `results/` (the gradio result wavs)
  and `gradio/` (gradio's own upload and cache dir, `GRADIO_TEMP_DIR`, unless set by the user); pruned by
  `--results_max_age`, `--results_max_mb`, and removed as a whole when the process exits. The process holds
  a lock on `TEMP_ROOT/.lock` for its life (`claim_temp_root`), so the next frontend to start on this machine
  removes what a killed one left (`remove_orphaned_temp_roots`).

Pruning removes files older than `max_age`, then the oldest until the total is at most `max_bytes`; it runs
after every write into a store and every `interval` seconds in a background thread (`Pruner`).
"""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

TEMP_PREFIX = "cosy-frontend-"
TEMP_ROOT = Path(tempfile.gettempdir()) / f"{TEMP_PREFIX}{os.getpid()}"
LOCK = ".lock"
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


def prune(root: Path, bounds: Bounds, keep: Path | None = None) -> int:
    """Remove files under `root` older than the bounds' age, then the oldest until the total fits (never
    `keep`: the file just written); empty subdirectories go too. The number of bytes left."""
    if not root.is_dir():
        return 0
    now, left = time.time(), []
    for mtime, sz, p in _files(root):
        if now - mtime > bounds.max_age and p != keep:
            p.unlink(missing_ok=True)
        else:
            left.append((mtime, sz, p))
    total = sum(sz for _, sz, _ in left)
    for mtime, sz, p in sorted(left, key=lambda t: t[0]):
        if total <= bounds.max_bytes:
            break
        if p != keep:
            p.unlink(missing_ok=True)
            total -= sz
    for dirpath, dirs, names in os.walk(root, topdown=False):
        if Path(dirpath) != root and not dirs and not names:
            try:
                os.rmdir(dirpath)
            except OSError:
                pass  # a file arrived meanwhile
    return total


class Pruner:
    """Prunes (root, bounds) pairs every `interval` seconds until `stop()`."""

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
                    prune(root, bounds)
                except OSError:
                    pass

    def stop(self) -> None:
        self._stop.set()


def remove_temp_root() -> None:
    shutil.rmtree(TEMP_ROOT, ignore_errors=True)


_claim: int | None = None  # the fd of our lock, held for the life of the process (closed by the kernel at exit)


def claim_temp_root() -> Path:
    """Create TEMP_ROOT and lock it (flock, exclusive) until this process ends, however it ends."""
    global _claim
    if _claim is None:
        TEMP_ROOT.mkdir(parents=True, exist_ok=True)
        fd = os.open(TEMP_ROOT / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        _claim = fd
    return TEMP_ROOT


def remove_orphaned_temp_roots(temp: Path | None = None) -> list[Path]:
    """Remove the temp roots of frontends that are gone (SIGKILLed, out of memory): those whose lock nobody
    holds. A lock works across PID namespaces (containers sharing a /tmp), a PID does not; a root without a
    lock (none taken yet, or an older version's) goes only when no process of that PID exists here."""
    removed = []
    for root in Path(temp or tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*"):
        if root == TEMP_ROOT or not root.is_dir():
            continue
        if _orphaned(root):
            shutil.rmtree(root, ignore_errors=True)
            removed.append(root)
    return removed


def _orphaned(root: Path) -> bool:
    try:
        fd = os.open(root / LOCK, os.O_RDWR)
    except FileNotFoundError:
        return not _pid_alive(root)
    except OSError:
        return False  # not ours to judge (permissions)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    # nobody holds it: its owner is gone (a lock dies with its process), unless it is starting right now,
    # between creating the lock file and taking it
    return not _pid_alive(root)


def _pid_alive(root: Path) -> bool:
    pid = root.name.removeprefix(TEMP_PREFIX)
    if not pid.isdigit():
        return True  # not a name we make: leave it
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    return True
