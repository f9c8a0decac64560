"""Where and when a benchmark ran, stored with its JSON results (the docs' performance page shows it): the
machine (CPU model, cores, GPU) and its load average at the start, the date, the commit (with "+dirty" when
the tree had changes) and the command line."""
from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()
    commit = git("rev-parse", "HEAD") or "unknown"
    return commit + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def provenance() -> dict:
    machine = f"{_cpu_model()}, {len(os.sched_getaffinity(0))} cores"
    try:
        import torch
        if torch.cuda.is_available():
            machine += f", {torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())  # other work on the machine weighs on every figure
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return {"machine": machine, "load_at_start": load, "date": date, "commit": _commit(),
            "command": shlex.join(["python", *sys.argv])}
