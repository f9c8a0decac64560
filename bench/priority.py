"""Priorities under saturation: one backend and one frontend on this machine, a bulk job that saturates them and
an interactive stream every few seconds, with the frontend's priorities on and off, alternating.

    python bench/priority.py [--size tiny|full | --model_dir DIR] [--rounds 2] [--phase 90] [--warmup 10]
        [--interval 4] [--bulk 0] [--idle 3] [--tokens 100] [--workers 1] [--max_batch 8] [--json OUT]

Starts the backend (launch/backend.py: vLLM with --scheduling-policy priority) once, then per phase a frontend
(app.py with `--priorities on|off` and `--fixed_tokens`, so every request generates exactly --tokens speech
tokens whatever the random weights prefer), on/off in ABBA order over --rounds rounds. Each phase:
  idle: --idle interactive streams one at a time on the idle deployment (the reference first packet);
  saturated: --bulk client threads (0: workers x max_batch + 4, every slot and some of the queue) each sending
    non-streamed PAI requests with `priority: bulk` back to back (the frontend's queue and the backend stay
    full: a batch job through the API), and an interactive PAI stream (its default class) every --interval s;
    streams start over --phase s after --warmup s; the window ends when the last of them has ended, so that it
    holds all of their work in both settings (a stream that starts late in it ends later without priorities).
Per setting it prints the interactive first packet p50/p95 (saturated and idle, and their ratio), the streams'
underrun (a listener who starts playing at the first packet: cosy.frontend.qos.Playback, from the SSE events'
arrival and audio) and continuous share, and the bulk throughput (audio seconds of the bulk answers completed in
the window per wall second). The issue's targets: with priorities, the saturated first packet within 1.5x of
the idle one, and the bulk throughput at least 90 % of what it is without priorities.
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from deployment import READY, stop  # noqa: E402
from lm_throughput import start_backend  # noqa: E402
from provenance import provenance  # noqa: E402
from voice_prompt import PROMPT_TEXT, PROMPT_WAV, TEXT  # noqa: E402

from cosy.frontend.qos import Playback  # noqa: E402

RATE = 24000  # pcm16 mono
SETTINGS = ("on", "off")


@dataclass
class Stream:
    """One interactive stream as its client saw it."""

    start: float
    first_packet: float = float("nan")
    underrun: float = float("nan")
    audio: float = 0.0
    ok: bool = False
    error: str = ""


@dataclass
class Bulk:
    """What the bulk clients completed: (end time, audio seconds) of each answer; failures by message."""

    done: list[tuple[float, float]] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_frontend(model_dir: Path, data_dir: Path, args, llm_url: str, setting: str) -> tuple:
    """app.py with `--priorities setting`; returns it and its URL once ready."""
    cmd = [sys.executable, str(ROOT / "app.py"), "--model_dir", str(model_dir), "--data_dir", str(data_dir),
           "--host", "127.0.0.1", "--port", str(free_port()), "--workers", str(args.workers), "--max_batch",
           str(args.max_batch), "--fixed_tokens", str(args.tokens), "--device", args.device,
           "--llm_stall_timeout", str(args.llm_stall_timeout), "--llm_base_url", llm_url, "--llm_api_key",
           args.llm_api_key, "--priorities", setting]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    tail: list[str] = []
    for line in proc.stdout:
        tail = (tail + [line])[-30:]
        if line.startswith(READY):
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, line[len(READY):].strip().rstrip("/") + "/"
    raise SystemExit("frontend did not start:\n" + "".join(tail))


def body(ref: str, stream: bool, priority: str | None = None) -> dict:
    inp = {"mode": "fast_replication", "text": TEXT, "reference_audio_id": ref, "output_format": "pcm"}
    if priority:
        inp["priority"] = priority
    return {"input": inp, "stream": stream}


def interactive(url: str, ref: str) -> Stream:
    """One PAI SSE stream at its default class (interactive); first packet from sending, underrun as heard."""
    s = Stream(time.monotonic())
    play = Playback(s.start)
    try:
        with httpx.stream("POST", f"{url}api/v1/audio/speech", json=body(ref, True), timeout=600) as r:
            if r.status_code != 200:
                s.error = f"{r.status_code}"
                return s
            for line in r.iter_lines():
                if not line.startswith("data:"):
                    continue
                event = json.loads(line[5:])
                if event.get("error"):
                    s.error = event["error"].get("message", "error")[:80]
                    return s
                seconds = len(base64.b64decode(event["output"]["audio"]["data"] or "")) / 2 / RATE
                if seconds > 0:
                    play.chunk(time.monotonic(), seconds)
        s.first_packet, s.underrun, s.audio, s.ok = play.first_packet, play.underrun, play.audio, True
    except httpx.HTTPError as e:
        s.error = type(e).__name__
    return s


def bulk_client(url: str, ref: str, stop_at: threading.Event, out: Bulk) -> None:
    """Non-streamed bulk requests back to back until `stop_at` (a busy answer: retry after a second)."""
    with httpx.Client(timeout=600) as client:
        while not stop_at.is_set():
            try:
                r = client.post(f"{url}api/v1/audio/speech", json=body(ref, False, "bulk"))
                if r.status_code == 200:
                    data = base64.b64decode(r.json()["output"]["audio"]["data"])
                    with out.lock:
                        out.done.append((time.monotonic(), len(data) / 2 / RATE))
                    continue
                why = f"{r.status_code}"
            except httpx.HTTPError as e:
                why = type(e).__name__
            with out.lock:
                out.errors[why] = out.errors.get(why, 0) + 1
            stop_at.wait(1.0)


def upload(url: str) -> str:
    r = httpx.post(f"{url}api/v1/audio/reference_audio", files={"file": ("p.wav", PROMPT_WAV.read_bytes())},
                   data={"text": PROMPT_TEXT}, timeout=120)
    r.raise_for_status()
    return r.json()["id"]


def pct(values: list[float], q: float) -> float:
    values = sorted(v for v in values if v == v)
    if not values:
        return float("nan")
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def phase(url: str, ref: str, args) -> dict:
    """The idle reference, then the saturated window; the raw figures of one phase."""
    idle = [interactive(url, ref) for _ in range(args.idle)]
    bulk, stop_at, streams = Bulk(), threading.Event(), []
    clients = [threading.Thread(target=bulk_client, args=(url, ref, stop_at, bulk), daemon=True)
               for _ in range(args.bulk)]
    for c in clients:
        c.start()
    time.sleep(args.warmup)  # the queue fills, the workers and the backend reach their steady state
    t0 = time.monotonic()
    threads = []
    while time.monotonic() - t0 < args.phase:
        t = threading.Thread(target=lambda: streams.append(interactive(url, ref)), daemon=True)
        t.start()
        threads.append(t)
        time.sleep(args.interval)
    for t in threads:
        t.join(600)
    t1 = time.monotonic()  # every stream's work is inside [t0, t1]
    stop_at.set()
    for c in clients:
        c.join(600)
    in_window = [a for end, a in bulk.done if t0 <= end <= t1]
    return {"idle": [vars(s) for s in idle], "streams": [vars(s) for s in streams],
            "bulk_audio_s": sum(in_window), "bulk_answers": len(in_window), "window_s": t1 - t0,
            "bulk_errors": bulk.errors}


def summary(phases: list[dict]) -> dict:
    streams = [s for p in phases for s in p["streams"] if s["ok"]]
    idle = [s["first_packet"] for p in phases for s in p["idle"] if s["ok"]]
    first = [s["first_packet"] for s in streams]
    under = [s["underrun"] for s in streams]
    tried = sum(len(p["streams"]) for p in phases)
    return {"streams": len(streams), "streams_failed": tried - len(streams),
            "first_p50": pct(first, 0.5), "first_p95": pct(first, 0.95),
            "idle_first_p50": pct(idle, 0.5), "idle_first_p95": pct(idle, 0.95),
            "first_p50_vs_idle": pct(first, 0.5) / pct(idle, 0.5),
            "first_p95_vs_idle": pct(first, 0.95) / pct(idle, 0.95),
            "underrun_mean": statistics.fmean(under) if under else float("nan"), "underrun_p95": pct(under, 0.95),
            "continuous": sum(u == 0.0 for u in under) / len(under) if under else float("nan"),
            "bulk_audio_per_wall": sum(p["bulk_audio_s"] for p in phases) / sum(p["window_s"] for p in phases),
            "bulk_answers": sum(p["bulk_answers"] for p in phases),
            "bulk_errors": {k: sum(p["bulk_errors"].get(k, 0) for p in phases)
                            for k in {k for p in phases for k in p["bulk_errors"]}}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", choices=("tiny", "full"), default="tiny")
    ap.add_argument("--model_dir", type=Path)
    ap.add_argument("--rounds", type=int, default=2, help="rounds of both settings, ABBA order (default 2)")
    ap.add_argument("--phase", type=float, default=90.0, help="seconds measured per phase (default 90)")
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds of bulk load before measuring (default 10)")
    ap.add_argument("--interval", type=float, default=4.0, help="seconds between interactive streams (default 4)")
    ap.add_argument("--bulk", type=int, default=0, help="bulk clients (default workers x max_batch + 4)")
    ap.add_argument("--idle", type=int, default=3, help="idle interactive streams per phase (default 3)")
    ap.add_argument("--tokens", type=int, default=100, help="speech tokens per request (default 100: 4 s of audio)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--max_batch", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--llm_stall_timeout", type=float, default=120.0)
    ap.add_argument("--llm_api_key", default="bench-key")
    ap.add_argument("--json", type=Path, help="write the results (with provenance) here")
    args = ap.parse_args()
    args.bulk = args.bulk or args.workers * args.max_batch + 4
    report = {"provenance": provenance(), "args": {k: str(v) for k, v in vars(args).items()}, "phases": []}
    with tempfile.TemporaryDirectory(prefix="cosy-bench-priority-") as tmp:
        model_dir = args.model_dir
        if model_dir is None:
            from cosy.verify.random_model import write_random_model
            model_dir = write_random_model(Path(tmp) / "model", args.size, seed=0)
        backend, llm_url = start_backend(model_dir, free_port(), args.llm_api_key,
                                         ("--scheduling_policy", "priority"))
        try:
            order = [s for r in range(args.rounds) for s in (SETTINGS if r % 2 == 0 else SETTINGS[::-1])]
            for i, setting in enumerate(order):
                front, url = start_frontend(model_dir, Path(tmp) / "data", args, llm_url, setting)
                try:
                    result = phase(url, upload(url), args)
                finally:
                    stop(front)
                result["setting"] = setting
                report["phases"].append(result)
                s = summary([result])
                print(f"phase {i + 1}/{len(order)} priorities {setting}: {s['streams']} streams, first packet "
                      f"p50 {s['first_p50']:.2f}s p95 {s['first_p95']:.2f}s (idle p50 {s['idle_first_p50']:.2f}s), "
                      f"underrun mean {s['underrun_mean']:.2f}s, bulk {s['bulk_audio_per_wall']:.3f} audio-s/s "
                      f"({s['bulk_answers']} answers)", flush=True)
        finally:
            stop(backend)
    report["settings"] = {s: summary([p for p in report["phases"] if p["setting"] == s]) for s in SETTINGS}
    on, off = report["settings"]["on"], report["settings"]["off"]
    report["bulk_on_vs_off"] = on["bulk_audio_per_wall"] / off["bulk_audio_per_wall"]
    print(f"\n{'priorities':<11} {'streams':>7} {'fp p50':>7} {'fp p95':>7} {'idle p50':>8} {'p50/idle':>8} "
          f"{'p95/idle':>8} {'underrun':>8} {'und p95':>7} {'contin.':>7} {'bulk a-s/s':>10}")
    for name, s in report["settings"].items():
        print(f"{name:<11} {s['streams']:>7} {s['first_p50']:>6.2f}s {s['first_p95']:>6.2f}s "
              f"{s['idle_first_p50']:>7.2f}s {s['first_p50_vs_idle']:>8.2f} {s['first_p95_vs_idle']:>8.2f} "
              f"{s['underrun_mean']:>7.2f}s {s['underrun_p95']:>6.2f}s {100 * s['continuous']:>6.0f}% "
              f"{s['bulk_audio_per_wall']:>10.3f}" + (f"  failed streams {s['streams_failed']}, bulk errors "
                                                      f"{s['bulk_errors']}" if s['streams_failed'] or s['bulk_errors']
                                                      else ""))
    print(f"bulk throughput with priorities / without: {report['bulk_on_vs_off']:.2f} (target >= 0.90); "
          f"saturated first packet p50 / idle p50 with priorities: {on['first_p50_vs_idle']:.2f} (target <= 1.5)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
