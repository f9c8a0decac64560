"""A process's own temp dir, `$TMPDIR/<prefix><pid>`, locked for the life of the process, and the removal of
those whose process is gone (SIGKILLed, out of memory), by the next process of the same kind to start.

The frontend keeps its gradio files and results there (`cosy.frontend.store`); the backend hands its vLLM
child one as TMPDIR (`cosy.deploy.backend`), since vLLM leaves its rendezvous file and IPC sockets in the
temp dir even after a clean stop.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

LOCK = ".lock"


class TempRoot:
    """`$TMPDIR/<prefix><pid>` of this process. `claim()` creates and locks it (flock, exclusive) until the
    process ends, however it ends; `remove()` deletes it."""

    def __init__(self, prefix: str, temp: Path | None = None):
        self.prefix = prefix
        self.path = Path(temp or tempfile.gettempdir()) / f"{prefix}{os.getpid()}"
        self._fd: int | None = None  # our lock, held for the life of the process (closed by the kernel at exit)

    def claim(self) -> Path:
        if self._fd is None:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            self._fd = fd
        return self.path

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def remove_orphans(self) -> list[Path]:
        """Remove the roots of this prefix whose process is gone: those whose lock nobody holds. A lock works
        across PID namespaces (containers sharing a /tmp), a PID does not; a root without a lock (none taken
        yet, or an older version's) goes only when no process of that PID exists here."""
        removed = []
        for root in self.path.parent.glob(f"{self.prefix}*"):
            if root == self.path or not root.is_dir():
                continue
            if self._orphaned(root):
                shutil.rmtree(root, ignore_errors=True)
                removed.append(root)
        return removed

    def _orphaned(self, root: Path) -> bool:
        try:
            fd = os.open(root / LOCK, os.O_RDWR)
        except FileNotFoundError:
            return not self._pid_alive(root)
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
        return not self._pid_alive(root)

    def _pid_alive(self, root: Path) -> bool:
        pid = root.name.removeprefix(self.prefix)
        if not pid.isdigit():
            return True  # not a name we make: leave it
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True  # alive, another user's
        return True
