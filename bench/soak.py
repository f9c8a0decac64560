"""Soak a frontend with mixed good and bad requests and random client disconnects; check nothing grows.

    python bench/soak.py [--minutes 10] [--clients 4] [--model_dir DIR] [--llm_base_url URL --llm_api_key K]
                         [--device cpu|cuda]

Starts its own `app.py` on loopback (a tiny random model built into a temp dir unless --model_dir), with a
fresh data dir and TMPDIR and small store bounds (--uploads_max_mb, --results_max_mb), then runs
--clients threads until the time is up. Each picks at random: PAI speech (streamed or not), OpenAI speech,
a reference-audio upload (good: distinct audio each time, so the upload store must prune; bad: garbage,
too short, NaN), bad speech requests (unknown voice, wrong fields), gradio_client calls (/zero_shot with
an upload, /saved_voice, /list_voices), raw gradio API calls, the PAI duplex WebSocket (some with an
unknown voice) and the OpenAI-style streaming WebSocket; about a third of the requests leave early
(mid-stream, while queued or while running). After --warmup seconds the clients pause, the server
settles, and the baseline is taken; at the end the same. Printed: RSS of the app's process tree, its open
files (fds), the files and bytes under its TMPDIR, the data dir size, and the answers by kind and status.
Exit status 1 if a figure grew beyond its bound (RSS: --rss_growth_mb; fds: --fd_growth; temp and data dir:
the configured store bounds plus --slack_mb), the pool is not idle after the clients stop, the server
answered 500, or it stopped answering.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import numpy as np
import soundfile as sf
from soak_probe import AppProcess, free_port, pool_state, show, snapshot, wait_idle  # noqa: E402,F401

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from voice_prompt import PROMPT_TEXT, PROMPT_WAV  # noqa: E402

TEXTS = ["你好。", "今天天气很好，我们一起去公园散步。",
         "收到好友从远方寄来的生日礼物，那份意外的惊喜与深深的祝福让我心中充满了甜蜜的快乐。"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0, help="how long the load runs (default 10)")
    p.add_argument("--warmup", type=float, default=None,
                   help="seconds of load before the baseline (default: 20%% of the run, 15..90 s)")
    p.add_argument("--clients", type=int, default=4, help="concurrent client threads (default 4)")
    p.add_argument("--leave", type=float, default=0.35, help="share of requests that leave early (0.35)")
    p.add_argument("--model_dir", default=None, help="a model dir (default: a tiny random model)")
    p.add_argument("--llm_base_url", default=None, help="LM backends for the app (default: embedded LM)")
    p.add_argument("--llm_api_key", default=None)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--device", default="cpu", help="the app's --device (default cpu)")
    p.add_argument("--max_queue", type=int, default=6, help="the app's --max_queue (small: 429s happen)")
    p.add_argument("--uploads_max_mb", type=float, default=2.0)
    p.add_argument("--results_max_mb", type=float, default=4.0)
    p.add_argument("--rss_growth_mb", type=float, default=150.0, help="allowed RSS growth of the tree")
    p.add_argument("--fd_growth", type=int, default=16, help="allowed growth of open fds of the tree")
    p.add_argument("--slack_mb", type=float, default=4.0, help="allowed excess over the store bounds")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


# ---- the app -------------------------------------------------------------------------------------------

def wav_bytes(audio: np.ndarray, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, rate, format="WAV", subtype="FLOAT")
    return buf.getvalue()


def raw(url: str, method: str, path: str, body: bytes, ctype: str, leave_after: float | None) -> int | None:
    """One request on a raw socket; with `leave_after`, the socket is shut down after that many seconds
    (mid-answer, or before it started), as a killed client does. The status, or None if we left first."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=120)
    try:
        sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: {ctype}\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        got, deadline = b"", None if leave_after is None else time.monotonic() + leave_after
        while True:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                sock.settimeout(left)
            try:
                chunk = sock.recv(65536)
            except socket.timeout:
                if deadline is not None:
                    return None
                raise
            if not chunk:
                break
            got += chunk
        line = got.split(b"\r\n", 1)[0].split()
        return int(line[1]) if len(line) > 1 else -1
    finally:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()


def _until(ws, leave: float | None, last) -> dict | None:
    """Read a WebSocket's JSON messages (audio frames skipped) until `last(message)`; that message, or None
    once `leave` seconds passed (the caller then closes the socket mid-task)."""
    start = time.monotonic()
    while leave is None or time.monotonic() - start < leave:
        try:
            message = ws.recv(timeout=120 if leave is None else 1)
        except TimeoutError:
            if leave is None:
                raise
            continue
        if isinstance(message, str) and last(event := json.loads(message)):
            return event
    return None


class Soak:
    def __init__(self, app: AppProcess, args: argparse.Namespace):
        self.app, self.url, self.args = app, app.url, args
        self.stats: Counter = Counter()
        self.errors: Counter = Counter()  # (kind, the message the server gave) for each failed request
        self.lock = threading.Lock()
        self.pause, self.stop = threading.Event(), threading.Event()
        self.paused = threading.Semaphore(0)
        self.prompt = sf.read(PROMPT_WAV, dtype="float32")[0]
        r = httpx.post(f"{self.url}/api/v1/audio/reference_audio", timeout=120,
                       files={"file": ("prompt.wav", PROMPT_WAV.read_bytes())}, data={"text": PROMPT_TEXT})
        r.raise_for_status()
        self.ref = r.json()["id"]

    def record(self, kind: str, status, error: str | None = None) -> None:
        with self.lock:
            self.stats[(kind, status)] += 1
            if error:
                self.errors[(kind, " ".join(error.split())[:200])] += 1

    def leave(self, rng: random.Random) -> float | None:
        return rng.uniform(0.05, 3.0) if rng.random() < self.args.leave else None

    # each returns (kind, status: int, "left", or an exception name)
    def pai(self, rng):
        stream = rng.random() < 0.5
        body = {"model": "CosyVoice2-0.5B", "stream": stream,
                "input": {"mode": "fast_replication", "text": rng.choice(TEXTS), "reference_audio_id": self.ref,
                          "output_format": rng.choice(["wav", "pcm", "mp3"]), "seed": rng.randrange(1000)}}
        s = raw(self.url, "POST", "/api/v1/audio/speech", json.dumps(body).encode(), "application/json",
                self.leave(rng))
        return f"pai_{'sse' if stream else 'json'}", s

    def openai(self, rng):
        body = {"model": "tts-1", "input": rng.choice(TEXTS), "voice": self.ref,
                "response_format": rng.choice(["wav", "pcm", "mp3"])}
        return "openai", raw(self.url, "POST", "/v1/audio/speech", json.dumps(body).encode(), "application/json",
                             self.leave(rng))

    def bad_speech(self, rng):
        body = rng.choice([
            {"input": {"mode": "fast_replication", "text": "你好", "reference_audio_id": "no-such-voice"}},
            {"input": {"mode": "fast_replication", "text": "", "reference_audio_id": self.ref}},
            {"input": {"mode": "fast_replication", "text": "你好", "reference_audio_id": self.ref, "speed": 99}},
            {"input": {"mode": "natural_language_replication", "text": "你好", "reference_audio_id": self.ref}},
            "not json at all {"])
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        return "bad_speech", raw(self.url, "POST", "/api/v1/audio/speech", data, "application/json", None)

    def upload(self, rng):
        good = rng.random() < 0.5
        if good:  # distinct content each time: the upload store fills and must prune
            audio = self.prompt * rng.uniform(0.5, 0.9)
            data, name = wav_bytes(audio.astype(np.float32)), "prompt.wav"
        else:
            data, name = rng.choice([(os.urandom(rng.randrange(10, 50000)), "garbage.wav"),
                                     (wav_bytes(np.zeros(1600, np.float32)), "short.wav"),
                                     (wav_bytes(np.full(32000, np.nan, np.float32)), "nan.wav")])
        r = httpx.post(f"{self.url}/api/v1/audio/reference_audio", timeout=120,
                       files={"file": (name, data)}, data={"text": PROMPT_TEXT})
        if good and r.status_code == 200 and rng.random() < 0.5:
            httpx.delete(f"{self.url}/api/v1/audio/reference_audio/{r.json()['id']}", timeout=30)
        return f"upload_{'good' if good else 'bad'}", r.status_code

    def gradio(self, rng, client, scratch: Path):
        from gradio_client import handle_file
        name = rng.choice(["zero_shot", "zero_shot", "saved_voice", "list_voices"])
        try:
            if name == "zero_shot":  # a distinct prompt each time: the upload store fills and must prune
                prompt = scratch / f"prompt-{rng.randrange(10**9)}.wav"
                prompt.write_bytes(wav_bytes((self.prompt * rng.uniform(0.5, 0.9)).astype(np.float32)))
                try:
                    client.predict(rng.choice(TEXTS[:2]), PROMPT_TEXT, handle_file(str(prompt)), 0, 1.0,
                                   api_name="/zero_shot")
                finally:
                    prompt.unlink()
            elif name == "saved_voice":
                client.predict(rng.choice(TEXTS[:2]), self.ref, 0, 1.0, api_name="/saved_voice")
            else:
                client.predict(api_name="/list_voices")
            return f"gradio_{name}", 200
        except Exception as e:  # gradio_client raises the server's gr.Error (e.g. busy)
            return f"gradio_{name}", type(e).__name__, str(e)

    def gradio_raw(self, rng):
        """A raw /gradio_api/call whose event stream is read to the end, or abandoned early."""
        r = httpx.post(f"{self.url}/gradio_api/call/saved_voice", timeout=30,
                       json={"data": [rng.choice(TEXTS), self.ref if rng.random() < 0.8 else "nope", 0, 1.0]})
        if r.status_code != 200:
            return "gradio_raw", r.status_code
        event, leave = r.json()["event_id"], self.leave(rng)
        with httpx.Client(timeout=120) as c, c.stream("GET", f"{self.url}/gradio_api/call/saved_voice/{event}") as s:
            start = time.monotonic()
            for _ in s.iter_raw():
                if leave is not None and time.monotonic() - start > leave:
                    return "gradio_raw", "left"
        return "gradio_raw", s.status_code

    def ws_pai(self, rng):
        """The PAI duplex socket: run-task, the text in pieces, finish-task, audio to task-finished; or
        left early (the socket closed mid-task), or a bad task (unknown voice: task-failed expected)."""
        from websockets.sync.client import connect
        bad, leave = rng.random() < 0.15, self.leave(rng)
        params = {"mode": "fast_replication", "output_format": "pcm",
                  "reference_audio_id": "no-such-voice" if bad else self.ref}
        with connect(self.url.replace("http://", "ws://") + "/api-ws/v1/audio/speech", open_timeout=30) as ws:
            def send(action: str, payload: dict) -> None:
                ws.send(json.dumps({"header": {"action": action, "task_id": "t", "streaming": "duplex"},
                                    "payload": payload}))
            send("run-task", {"parameters": params, "input": {}})
            for piece in rng.choice(TEXTS).split("，"):
                send("continue-task", {"input": {"text": piece}})
            send("finish-task", {"input": {}})
            end = _until(ws, leave, lambda m: m["header"]["event"] in ("task-finished", "task-failed"))
            if end is None:
                return "ws_pai", "left"
            h = end["header"]
            return f"ws_pai{'_bad' if bad else ''}", h["event"], h.get("error_message")

    def ws_openai(self, rng):
        """The OpenAI-style streaming socket: session.config, text deltas, input.done, audio to done."""
        from websockets.sync.client import connect
        leave = self.leave(rng)
        with connect(self.url.replace("http://", "ws://") + "/v1/audio/speech/stream", open_timeout=30) as ws:
            ws.send(json.dumps({"type": "session.config", "voice": self.ref, "response_format": "pcm"}))
            ws.recv(timeout=30)
            for piece in rng.choice(TEXTS).split("，"):
                ws.send(json.dumps({"type": "input.text", "delta": piece}))
            ws.send(json.dumps({"type": "input.done"}))
            end = _until(ws, leave, lambda m: m["type"] in ("speech.audio.done", "error"))
            if end is None:
                return "ws_openai", "left"
            return "ws_openai", end["type"], (end.get("error") or {}).get("message")

    def client(self, i: int) -> None:
        from gradio_client import Client
        rng = random.Random(self.args.seed * 1000 + i)
        gc = Client(self.url + "/", verbose=False)
        scratch = Path(tempfile.mkdtemp(prefix="soak-client-"))  # the client's side: not the app's TMPDIR

        def gradio(r):
            return self.gradio(r, gc, scratch)

        kinds = [self.pai] * 4 + [self.openai] * 2 + [self.bad_speech, self.upload, self.upload, self.gradio_raw,
                                                       gradio, gradio, self.ws_pai, self.ws_pai, self.ws_openai]
        while not self.stop.is_set():
            if self.pause.is_set():
                self.paused.release()
                while self.pause.is_set() and not self.stop.is_set():
                    time.sleep(0.1)
                continue
            fn = rng.choice(kinds)
            try:
                kind, status, *error = fn(rng)
                self.record(kind, "left" if status is None else status, *error)
            except Exception as e:
                self.record(getattr(fn, "__name__", "gradio"), type(e).__name__, str(e))
        shutil.rmtree(scratch, ignore_errors=True)

    def hold(self, threads: list[threading.Thread]) -> None:
        """Pause every client between requests (for a quiet measurement)."""
        self.pause.set()
        for t in threads:
            if t.is_alive():
                self.paused.acquire(timeout=180)


def main(argv=None) -> int:
    args = parse_args(argv)
    seconds = args.minutes * 60
    warmup = args.warmup if args.warmup is not None else min(90.0, max(15.0, 0.2 * seconds))
    work = Path(tempfile.mkdtemp(prefix="cosy-soak-"))
    try:
        if args.model_dir:
            model_dir = Path(args.model_dir)
        else:
            from cosy.verify.random_model import write_random_model
            model_dir = write_random_model(work / "model", "tiny", seed=1)
        app = AppProcess(args, model_dir, work)
        try:
            app.wait()
            print(f"soak: {args.minutes:g} min ({warmup:.0f} s warm-up), {args.clients} clients, app at {app.url} "
                  f"(workers {args.workers}, max_queue {args.max_queue}, uploads_max_mb {args.uploads_max_mb:g}, "
                  f"results_max_mb {args.results_max_mb:g})", flush=True)
            show("started", snapshot(app))
            return run(app, args, seconds, warmup)
        finally:
            code = app.stop()
            left = sorted(p.name for p in app.tmp.iterdir()) if app.tmp.exists() else []
            print(f"app stopped: exit status {code}; left in its TMPDIR: {', '.join(left) or 'nothing'}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(app: AppProcess, args: argparse.Namespace, seconds: float, warmup: float) -> int:
    soak = Soak(app, args)
    threads = [threading.Thread(target=soak.client, args=(i,), daemon=True) for i in range(args.clients)]
    start = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(warmup)
    soak.hold(threads)
    idle_base = wait_idle(app.url, 30)
    time.sleep(2)
    base = snapshot(app)
    show("baseline", base)
    soak.pause.clear()
    peak = dict(base)
    next_sample = time.monotonic() + 30
    while time.monotonic() - start < seconds:
        time.sleep(1)
        if time.monotonic() >= next_sample:
            s = snapshot(app)
            peak = {k: max(v, s[k]) for k, v in peak.items()}
            show(f"{time.monotonic() - start:.0f} s", s)
            next_sample += 30
    soak.stop.set()
    for t in threads:
        t.join(180)
    idle = wait_idle(app.url, 10)
    time.sleep(2)
    end = snapshot(app)
    peak = {k: max(v, end[k]) for k, v in peak.items()}
    show("end", end)
    show("peak", peak)
    healthy = httpx.get(f"{app.url}/health", timeout=10).status_code == 200
    total = sum(soak.stats.values())
    print(f"{total} requests in {time.monotonic() - start:.0f} s:")
    by_kind: dict[str, Counter] = {}
    for (kind, status), n in soak.stats.items():
        by_kind.setdefault(kind, Counter())[str(status)] += n
    for kind in sorted(by_kind):
        print(f"  {kind:>20}: " + ", ".join(f"{s} x{n}" for s, n in sorted(by_kind[kind].items())))
    if soak.errors:
        print("error messages (a failed task, an error event, a client-side exception):")
        for (kind, message), n in sorted(soak.errors.items(), key=lambda kv: -kv[1]):
            print(f"  {kind:>20} x{n}: {message}")
    slack = args.slack_mb
    # temp: results/ and gradio/ are each pruned to --results_max_mb (every 30 s and after each write)
    checks = [
        ("RSS", end["rss_mb"] <= base["rss_mb"] + args.rss_growth_mb,
         f"{base['rss_mb']:.1f} -> {end['rss_mb']:.1f} MB (allowed +{args.rss_growth_mb:g})"),
        ("open fds", end["fds"] <= base["fds"] + args.fd_growth,
         f"{base['fds']} -> {end['fds']} (allowed +{args.fd_growth})"),
        ("temp files", end["tmp_mb"] <= max(base["tmp_mb"], 2 * args.results_max_mb) + slack,
         f"{base['tmp_mb']:.2f} -> {end['tmp_mb']:.2f} MB ({base['tmp_files']} -> {end['tmp_files']} files; "
         f"bound 2 x {args.results_max_mb:g} + {slack:g} MB)"),
        ("uploads", end["uploads_mb"] <= args.uploads_max_mb + slack,
         f"{base['uploads_mb']:.2f} -> {end['uploads_mb']:.2f} MB (bound {args.uploads_max_mb:g} + {slack:g} MB)"),
        ("data dir", end["data_mb"] <= max(base["data_mb"], args.uploads_max_mb) + slack,
         f"{base['data_mb']:.2f} -> {end['data_mb']:.2f} MB"),
        ("pool idle", idle_base and idle, f"after the warm-up: {idle_base}, at the end: {idle}"),
        ("no 500", not any(s == 500 for (_, s) in soak.stats), "answers with status 500: "
         f"{sum(n for (_, s), n in soak.stats.items() if s == 500)}"),
        ("healthy", healthy, "/health at the end"),
    ]
    failed = [name for name, ok, _ in checks if not ok]
    for name, ok, detail in checks:
        print(f"  {'ok  ' if ok else 'FAIL'} {name}: {detail}")
    print("soak: " + ("FAILED: " + ", ".join(failed) if failed else "passed"), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
