"""What bench/soak.py runs and measures: its own `app.py` process (AppProcess) and the figures taken of it
(RSS of the process tree, open fds, temp files, data dir size, the worker pool's busy/waiting gauges)."""
from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
READY = "cosy frontend ready: "


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AppProcess:
    def __init__(self, args: argparse.Namespace, model_dir: Path, work: Path):
        self.data, self.tmp = work / "data", work / "tmp"
        self.tmp.mkdir(parents=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, str(ROOT / "app.py"), "--model_dir", str(model_dir), "--data_dir", str(self.data),
               "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(args.workers),
               "--max_queue", str(args.max_queue), "--uploads_max_mb", str(args.uploads_max_mb),
               "--results_max_mb", str(args.results_max_mb), "--device", args.device]
        if args.llm_base_url:
            cmd += ["--llm_base_url", args.llm_base_url, "--llm_api_key", args.llm_api_key or ""]
        env = {**os.environ, "TMPDIR": str(self.tmp), "PYTHONUNBUFFERED": "1"}
        env.pop("GRADIO_TEMP_DIR", None)  # the app's own, under its TMPDIR, pruned by --results_max_mb
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith(READY):
                self.ready.set()

    def wait(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the app did not start:\n" + "".join(self.lines[-30:]))

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def _tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def _du(root: Path) -> tuple[int, int]:
    files = size = 0
    for dirpath, _, names in os.walk(root):
        for n in names:
            try:
                size += os.stat(os.path.join(dirpath, n)).st_size
                files += 1
            except OSError:
                pass
    return files, size


def snapshot(app: AppProcess) -> dict:
    rss = fds = 0
    procs = _tree(app.proc.pid)
    for p in procs:
        try:
            rss += p.memory_info().rss
            fds += p.num_fds()
        except psutil.NoSuchProcess:
            pass
    tmp_files, tmp_bytes = _du(app.tmp)
    _, data_bytes = _du(app.data)
    _, upload_bytes = _du(app.data / "uploads")
    return {"procs": len(procs), "rss_mb": rss / 2**20, "fds": fds, "tmp_files": tmp_files,
            "tmp_mb": tmp_bytes / 2**20, "data_mb": data_bytes / 2**20, "uploads_mb": upload_bytes / 2**20}


def show(label: str, s: dict) -> None:
    print(f"{label:>9}: processes {s['procs']}, RSS {s['rss_mb']:.1f} MB, open fds {s['fds']}, temp files "
          f"{s['tmp_files']} ({s['tmp_mb']:.2f} MB), data dir {s['data_mb']:.2f} MB "
          f"(uploads {s['uploads_mb']:.2f} MB)", flush=True)


def pool_state(url: str) -> tuple[float, float]:
    busy = waiting = None
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("cosy_workers_busy"):
            busy = float(line.split()[-1])
        elif line.startswith("cosy_queue_waiting"):
            waiting = float(line.split()[-1])
    return busy, waiting


def wait_idle(url: str, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if pool_state(url) == (0.0, 0.0):
            return True
        time.sleep(0.2)
    return False


# ---- requests ------------------------------------------------------------------------------------------
