"""Where a command's CPU time goes on this machine, by kind of process: run the test suite under it to see what
its minutes are made of (the durations pytest prints are wall times, inflated by whatever ran beside them).

    python bench/suite_cpu.py [--interval 0.5] -- .venv/bin/python -m pytest -n 2 --dist loadscope

Every `interval` s it reads every process's CPU time (user + system) and command line; a process is counted
with its largest reading, under the kind its command line names or else its parent's: vLLM backends (the
launcher, the API server, the engine and its worker), frontends (app.py and its speech workers), the cosy CLI,
the pytest processes, containers (everything under conmon), podman and its builds, Chromium, pip. The
machine's busy time over the run (/proc/stat) is printed beside the sum: the gap is processes shorter than
one interval and whatever else ran. It also prints how many of each kind started (vLLM starts: its engines).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict

import psutil

KINDS = (  # (kind, words of which one is in the command line), first match wins
    ("vLLM backend", ("launch/backend.py", "cosy.vllm_plugin", "VLLM::", "cosy-backend")),
    ("frontend (app.py + workers)", ("app.py", "cosy-frontend")),
    ("cosy CLI", ("-m cosy", "cosy.batch", "cosy.golden_check", "cosy.random_model")),
    ("pytest", ("pytest", "execnet", "exec(eval(sys.stdin")),
    ("podman (builds, compose)", ("podman", "buildah", "mmdebstrap", "runc")),
    ("chromium", ("chromium", "chrome")),
    ("pip", ("pip ", "/pip", "pip-")),
)


def kind_of(cmdline: str) -> str | None:
    for kind, words in KINDS:
        if any(w in cmdline for w in words):
            return kind
    return None


class Sampler(threading.Thread):
    def __init__(self, interval: float):
        super().__init__(daemon=True)
        self.interval, self.stop = interval, threading.Event()
        self.cpu: dict[tuple[int, float], float] = {}
        self.kind: dict[tuple[int, float], str] = {}
        self.engines: set[tuple[int, float]] = set()

    def classify(self, p: psutil.Process, cmd: str) -> str:
        """The kind of `p`: its command line's, else (containers aside) its nearest known ancestor's."""
        chain = [p]
        try:
            chain += p.parents()
        except psutil.Error:
            pass
        names = []
        for q in chain:
            try:
                names.append(q.name())
            except psutil.Error:
                names.append("")
        if "conmon" in names[1:]:
            return "containers"
        own = kind_of(cmd)
        if own:
            return own
        for q in chain[1:]:
            try:
                up = kind_of(" ".join(q.cmdline()))
            except psutil.Error:
                continue
            if up:
                return up
        return "other: " + (names[0] or "?")

    def run(self) -> None:
        while not self.stop.is_set():
            for p in psutil.process_iter(["pid", "create_time", "cpu_times", "cmdline", "name"]):
                info = p.info
                if info["cpu_times"] is None:
                    continue
                key = (info["pid"], info["create_time"])
                used = info["cpu_times"].user + info["cpu_times"].system
                self.cpu[key] = max(self.cpu.get(key, 0.0), used)
                cmd = " ".join(info["cmdline"] or []) or (info["name"] or "")
                if key not in self.kind:
                    self.kind[key] = self.classify(p, cmd)
                if "EngineCore" in cmd:  # vLLM titles its engine process once it runs (spawned first)
                    self.engines.add(key)
            self.stop.wait(self.interval)


def busy_seconds() -> float:
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + t.irq + t.softirq + getattr(t, "steal", 0.0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = ap.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command after --")
    before = {(p.info["pid"], p.info["create_time"]) for p in psutil.process_iter(["pid", "create_time"])}
    sampler = Sampler(args.interval)
    busy0, start = busy_seconds(), time.monotonic()
    sampler.start()
    rc = subprocess.call(command)
    sampler.stop.set()
    sampler.join()
    wall, busy = time.monotonic() - start, busy_seconds() - busy0
    by_kind, started = defaultdict(float), Counter()
    for key, used in sampler.cpu.items():
        if key in before:
            continue  # running before the command: not its work
        by_kind[sampler.kind[key]] += used
        started[sampler.kind[key]] += 1
    counted = sum(by_kind.values())
    print(f"\n{'kind of process':<34} {'CPU s':>8} {'share':>6} {'processes':>9}", file=sys.stderr)
    for kind, used in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        if used >= 1.0:
            print(f"{kind:<34} {used:8.0f} {used / busy:6.1%} {started[kind]:9d}", file=sys.stderr)
    print(f"{'counted':<34} {counted:8.0f} {counted / busy:6.1%}", file=sys.stderr)
    print(f"{'machine busy (/proc/stat)':<34} {busy:8.0f}   wall {wall:.0f} s, {psutil.cpu_count()} CPUs: "
          f"{busy / wall / psutil.cpu_count():.0%} busy; vLLM engines started: {len(sampler.engines)}",
          file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
