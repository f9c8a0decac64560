"""What a process that builds an engine costs to start (a speech worker, a CLI run), in CPU seconds, for this
checkout and optionally another one, alternating in one run (the machine's speed drifts):

    python bench/startup.py [--baseline /path/to/other/checkout] [--model_dir DIR] [--repeats 3] [--app]
        [--backend]

Two commands per checkout, each in a fresh interpreter with that checkout first on sys.path: `build` (import
and `Engine.from_model_dir`, what a worker does before it reports ready) and `cli` (a seeded streamed zero-shot
`python -m cosy` run of a short text). CPU = user + system of the child, from getrusage; medians printed.
--app adds `app`: `app.py` (its server and one speech worker, LM embedded) until it says it is ready, then
SIGTERM; CPU of the app and its worker. --backend adds `backend`: `launch/backend.py` (its vLLM server and
engine) until it is ready, one 20-token completion, then SIGTERM; CPU of the whole process tree, and its memory
at ready (proportional set size, so pages that a forked process shares are counted once). Without --model_dir
a tiny random model is built.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from voice_prompt import PROMPT_TEXT, PROMPT_WAV  # noqa: E402


def commands(model: Path, out: Path) -> dict[str, list[str]]:
    build = f"from cosy.pipeline.engine import Engine; Engine.from_model_dir({str(model)!r})"
    cli = ["-m", "cosy", "--model_dir", str(model), "--mode", "zero_shot", "--text", "Hello 123, 你好。",
           "--prompt_text", PROMPT_TEXT, "--prompt_wav", str(PROMPT_WAV), "--stream",
           "--seed", "1", "--out", str(out)]
    return {"build": ["-c", build], "cli": cli}


def children_cpu() -> float:
    """User + system CPU seconds of every child this process has waited for (and of their waited children)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cpu_of(args: list[str], checkout: Path) -> float:
    """CPU seconds of `python args` run with `checkout` first on the path."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    before = children_cpu()
    subprocess.run([sys.executable, *args], cwd=checkout, env=env, check=True, capture_output=True)
    return children_cpu() - before


@contextlib.contextmanager
def serving(args: list[str], checkout: Path, env: dict[str, str], ready: bytes) -> Iterator[subprocess.Popen]:
    """`python args` in `checkout`, yielded once a line of its output starts with `ready`; SIGTERM on exit."""
    proc = subprocess.Popen([sys.executable, *args], cwd=checkout, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    try:
        for line in proc.stdout:
            if line.startswith(ready):
                break
        else:
            raise RuntimeError(f"python {args[0]} of {checkout} exited before it was ready")
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait()


def backend_cost(model: Path, checkout: Path, cache: Path) -> tuple[float, float]:
    """(CPU seconds, memory MB at ready) of a backend of `checkout` started, asked for 20 tokens and stopped."""
    import psutil

    port = 18000 + os.getpid() % 1000
    env = {**os.environ, "PYTHONPATH": str(checkout), "VLLM_CPU_KVCACHE_SPACE": "1"}
    before = children_cpu()
    args = ["launch/backend.py", "--model_dir", str(model), "--no_api_key", "--host", "127.0.0.1", "--port",
            str(port), "--cache_dir", str(cache)]
    with serving(args, checkout, env, b"cosy backend ready") as proc:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        memory = sum(p.memory_full_info().pss for p in tree) / 2 ** 20
        url = f"http://127.0.0.1:{port}/v1"
        name = json.load(urllib.request.urlopen(f"{url}/models"))["data"][0]["id"]
        body = {"model": name, "prompt": [1, 2, 3], "max_tokens": 20, "ignore_eos": True}
        urllib.request.urlopen(urllib.request.Request(f"{url}/completions", json.dumps(body).encode(),
                                                      {"Content-Type": "application/json"}), timeout=300).read()
    return children_cpu() - before, memory


def app_cost(model: Path, checkout: Path, data: Path) -> float:
    """CPU seconds of an app of `checkout` (its server and one speech worker, embedded LM) started until it
    says it is ready, then stopped."""
    port = 17000 + os.getpid() % 1000
    env = {**os.environ, "PYTHONPATH": str(checkout), "PYTHONUNBUFFERED": "1"}
    before = children_cpu()
    args = ["app.py", "--model_dir", str(model), "--data_dir", str(data), "--host", "127.0.0.1", "--port", str(port)]
    with serving(args, checkout, env, b"cosy frontend ready: "):
        pass
    return children_cpu() - before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", type=Path, help="another checkout to compare with (e.g. a git worktree)")
    ap.add_argument("--model_dir", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backend", action="store_true", help="also the backend's start (CPU and memory)")
    ap.add_argument("--app", action="store_true", help="also an app's start (its server and one worker)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model_dir
        if model is None:
            from cosy.verify.random_model import write_random_model
            model = write_random_model(Path(tmp) / "model", "tiny", seed=1)
        checkouts = {"this": ROOT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
        cmds = commands(model, Path(tmp) / "out.wav")
        seconds: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeats):
            for what, cmd in cmds.items():
                for name, checkout in checkouts.items():  # alternating: drift hits both alike
                    seconds.setdefault((name, what), []).append(cpu_of(cmd, checkout))
            for name, checkout in checkouts.items() if args.app else ():
                seconds.setdefault((name, "app"), []).append(app_cost(model, checkout, Path(tmp) / f"data-{name}"))
            for name, checkout in checkouts.items() if args.backend else ():
                cpu, memory = backend_cost(model, checkout, Path(tmp) / f"cache-{name}")
                seconds.setdefault((name, "backend"), []).append(cpu)
                seconds.setdefault((name, "backend MB"), []).append(memory)
    print(f"model {model}; CPU seconds (user + system), medians of {args.repeats}, alternating")
    print(f"{'command':<8} " + " ".join(f"{name:>10}" for name in checkouts) + ("   ratio" if args.baseline else ""))
    for what in [*cmds, *(("app",) if args.app else ()), *(("backend", "backend MB") if args.backend else ())]:
        row = [statistics.median(seconds[(name, what)]) for name in checkouts]
        ratio = f"  {row[0] / row[1]:.2f}x" if args.baseline else ""
        print(f"{what:<8} " + " ".join(f"{s:10.2f}" for s in row) + ratio)


if __name__ == "__main__":
    main()
