"""Real servers for tests: the vLLM backend (`launch/backend.py`) and frontend apps (`app.py`)."""
from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gradio_client import Client

from cosy.lm.export import llm_fingerprint, served_model_name
from cosy.model.files import ModelDir

ROOT = Path(__file__).resolve().parents[1]
BACKEND = ROOT / "launch" / "backend.py"
API_KEY = "test-key"
READY = "cosy backend ready: "
READY_TIMEOUT = 300.0
READY_APP = "cosy frontend ready: "


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Backend:
    """`python launch/backend.py` on a fixed port; restartable on the same port."""

    def __init__(self, model_dir: Path, cache_dir: Path, log_path: Path, api_key: str = API_KEY,
                 max_model_len: int = 32768, extra: tuple[str, ...] = ()):
        self.model_dir, self.cache_dir, self.log_path, self.api_key = model_dir, cache_dir, log_path, api_key
        self.max_model_len = max_model_len  # the LM's context (the CPU default is 2048)
        self.extra = extra  # more flags of launch/backend.py (e.g. --max_num_seqs 1)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.model_name = served_model_name(llm_fingerprint(model_dir, cache_dir), ModelDir(model_dir).family)
        self.proc: subprocess.Popen | None = None
        self.stdout: list[str] = []
        self.ready = False

    def start(self, timeout: float = READY_TIMEOUT) -> None:
        self.launch()
        self.wait(timeout)

    def launch(self) -> None:
        """Start the process and return at once (`wait` blocks until it serves): start-ups overlap."""
        self.ready = False
        # 1 GiB of KV cache, not the backend's 2: plenty for the tiny models, and several backends run at once
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(BACKEND), "--model_dir", str(self.model_dir), "--host", "127.0.0.1",
                 "--port", str(self.port), "--api_key", self.api_key, "--cache_dir", str(self.cache_dir),
                 "--max_model_len", str(self.max_model_len), *self.extra],
                stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True, cwd=ROOT,
                env=env)
        self._lines: queue.Queue[str | None] = queue.Queue()

        def read(proc: subprocess.Popen, lines: queue.Queue) -> None:
            for raw in proc.stdout:
                self.stdout.append(raw.decode())
                lines.put(raw.decode())
            lines.put(None)

        threading.Thread(target=read, args=(self.proc, self._lines), daemon=True).start()

    def wait(self, timeout: float = READY_TIMEOUT) -> None:
        """Block until the launched backend prints that it serves; stop it and raise if it does not (and
        again on every later call)."""
        if self.ready:
            return
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                line = None
            if line is None or line.startswith(READY):
                break
        if line is None:
            self._lines.put(None)  # a later wait fails at once too
            self.stop()
            raise RuntimeError(f"backend not ready within {timeout:.0f} s; log tail:\n{self.log_tail()}")
        assert line == f"{READY}{self.url}\n"
        self.ready = True

    def stop(self, grace: float = 60.0) -> int | None:
        """SIGTERM the backend (it stops vLLM), SIGKILL its group after `grace` s; its exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # vLLM, in its own group, gets SIGTERM on our death
            return self.proc.wait()

    def crash(self) -> None:
        """SIGKILL the backend and every process under it at once, as a machine failure would."""
        import psutil
        if self.proc is None or self.proc.poll() is not None:
            return
        procs = [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(recursive=True)]
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=30)
        self.proc.wait()

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])


@contextmanager
def running_backend(model_dir: Path, folder: Path | None, launched: Backend | None = None) -> Iterator[Backend]:
    """A started `Backend` on `model_dir` (its export cache and log in `folder`), stopped on exit;
    `launched`: one already launched there (`Backend.launch`), waited for instead of started."""
    b = launched or Backend(model_dir, folder / "cache", folder / "backend.log")
    try:
        b.wait() if launched else b.start()
        yield b
    finally:
        b.stop()


class App:
    """One `python app.py` process; its output is collected so a failure to start can be shown."""

    def __init__(self, *args: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        # each app its own gradio dir, as in production (this process's import of cosy.frontend.server set
        # GRADIO_TEMP_DIR to its own: inherited, every app would share one, and one app's clean-up of a refused
        # upload would remove another's cached example of the same file)
        env = {k: v for k, v in os.environ.items() if k != "GRADIO_TEMP_DIR"} | {"PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), *args, "--host", "127.0.0.1", "--port",
                                      str(self.port)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith(READY_APP):
                self.ready.set()

    def wait(self, timeout: float = 180) -> "App":
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("app did not start:\n" + "".join(self.lines[-40:]))
        assert f"{READY_APP}http://127.0.0.1:{self.port}/\n" in self.lines
        return self

    def client(self) -> Client:
        return Client(self.url, verbose=False)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def start_apps(*arg_lists: list[str]) -> list[App]:
    """Start several apps at once (their start-ups overlap), wait for all; stop all if one fails."""
    apps = [App(*args) for args in arg_lists]
    try:
        return [a.wait() for a in apps]
    except BaseException:
        for a in apps:
            a.stop()
        raise


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples `name` whose labels include `labels`, in a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))
