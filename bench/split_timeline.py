"""Where a streaming request's first packet goes, in parts: one worker's engine (as app.py's worker runs it:
flow/HiFT work through one SpeechScheduler, each request on its thread), with the LM embedded and on a
backend, timed token by token and work item by work item.

    python bench/split_timeline.py [--model_dir DIR] [--tokens 100] [--repeats 3] [--concurrency 1,4]
        [--threads 2] [--speech_cache_mb 2048] [--lms embedded,backend,backend-off]
        [--backend_url URL | --backend_cpus LIST --backend_nice N --backend_idle]

Per LM and level (N requests started at once), medians over requests and --repeats of, in seconds since the
request started: the first token, the token the first chunk waits for (the official schedule: one hop, the
pad that aligns the prompt to a hop, and the look-ahead), when the prompt's last chunk computed ahead
started and how long it took (0 when the stream computes none), when its flow started (the wait in between is the
scheduler's queue behind other requests' work) and how long the flow and the HiFT step took, the first
chunk, and the whole request. The HTTP surfaces add their encoding and transport on top (bench/deployment.py
measures those end to end). Without --backend_url a backend is started on the model (`launch/backend.py`).
--lms: `backend` is the app's default on a backend of this machine (a stream's first chunk decoded apart,
`cosy.lm.first_chunk`), `backend-off` one request per sentence (`--llm_split_first_chunk off`).
--speech_cache_mb: the engines' flow state budget, by default app.py's on the CPU (2048 MB: the saved
voice's prompt chunks are computed once, not per request).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from lm_throughput import start_backend  # noqa: E402
from synthesis import PROMPT_TEXT, PROMPT_WAV, TEXT  # noqa: E402

from cosy.frontend.options import speech_cache_mb  # noqa: E402
from cosy.lm.fixed_length import FixedLengthLM  # noqa: E402
from cosy.pipeline.engine import Engine, SynthesisRequest  # noqa: E402
from cosy.speech.request import LiveRequest  # noqa: E402
from cosy.speech.scheduler import SpeechScheduler  # noqa: E402

PARTS = ("token1", "token_need", "ahead_start", "ahead", "flow_start", "flow", "hift", "first", "total")


class Timeline(threading.local):
    """This thread's request: its start, its tokens' and its work items' times."""
    start: float = 0.0
    tokens: list
    items: list  # (queued, started, ended) of each flow/HiFT work item, in order


class TimedLM:
    """The LM with each yielded token's time recorded in the calling thread's Timeline."""

    def __init__(self, lm, line: Timeline):
        self.lm, self.sampling, self.line = lm, lm.sampling, line

    def generate(self, *args, **kwargs):
        for token in self.lm.generate(*args, **kwargs):
            self.line.tokens.append(time.perf_counter() - self.line.start)
            yield token


class TimedRunner:
    """The engine's speech_runner (a worker's SpeechScheduler), recording each item's queue, start and end."""

    def __init__(self, scheduler: SpeechScheduler, line: Timeline):
        self.scheduler, self.line = scheduler, line

    def __call__(self, first, fn, batch=None):
        start, items = self.line.start, self.line.items  # this request's (the runner is another thread)
        queued = time.perf_counter() - start

        def timed():
            started = time.perf_counter() - start
            out = fn()
            items.append((queued, started, time.perf_counter() - start))
            return out
        # a batch function would run instead of `timed` when rows batch (--flow_batch > 1): time solo items
        return self.scheduler.run(first, timed, None)


def one(engine: Engine, line: Timeline, scheduler: SpeechScheduler, voice, rid: int) -> dict[str, float]:
    req = SynthesisRequest(mode="voice", text=TEXT, prompt_text=PROMPT_TEXT, voice=voice, stream=True, seed=rid)
    scheduler.bind(LiveRequest(rid, "synthesize", {}))
    line.tokens, line.items, line.start = [], [], time.perf_counter()
    first = None
    for _ in engine.synthesize(req):
        first = first or time.perf_counter() - line.start
    total = time.perf_counter() - line.start
    need = engine.t2w.first_chunk_tokens(voice.speech_tokens.shape[1])  # the tokens the first chunk waits for
    # the items done by the first chunk: its flow and HiFT step, after the prompt chunk computed ahead if any
    done = [item for item in line.items if item[2] <= first]
    (_, flow_start, flow_end), (_, hift_start, hift_end) = done[-2:]
    ahead = done[0] if len(done) == 3 else (0.0, 0.0, 0.0)
    return {"token1": line.tokens[0], "token_need": line.tokens[min(need, len(line.tokens)) - 1],
            "ahead_start": ahead[1], "ahead": ahead[2] - ahead[1],
            "flow_start": flow_start, "flow": flow_end - flow_start, "hift": hift_end - hift_start,
            "first": first, "total": total, "need": need}


def level(engine: Engine, line: Timeline, scheduler: SpeechScheduler, voice, n: int, base: int) -> list[dict]:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda i: one(engine, line, scheduler, voice, base + i), range(n)))


def report(name: str, n: int, runs: list[dict[str, float]]) -> None:
    m = {k: statistics.median(r[k] for r in runs) for k in PARTS}
    print(f"{name:<11} x{n:<2} token 1 {m['token1']:6.2f}  token {runs[0]['need']} {m['token_need']:6.2f}  "
          f"ahead starts {m['ahead_start']:6.2f}, takes {m['ahead']:5.2f}  "
          f"flow starts {m['flow_start']:6.2f}, takes {m['flow']:5.2f}  HiFT {m['hift']:5.2f}  "
          f"first chunk {m['first']:6.2f}  total {m['total']:6.2f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model_dir", type=Path, default=ROOT / ".cache" / "full-random")
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--speech_cache_mb", type=int, default=None, help="default: app.py's on the CPU")
    ap.add_argument("--lms", default="embedded,backend",
                    help="embedded, backend (the app's default: a stream's first chunk decoded apart on a "
                         "backend of this machine), backend-off (--llm_split_first_chunk off)")
    ap.add_argument("--backend_url")
    ap.add_argument("--api_key", default=os.environ.get("COSY_LLM_API_KEY", "bench-key"))
    ap.add_argument("--backend_cpus")
    ap.add_argument("--backend_nice", type=int, default=0)
    ap.add_argument("--backend_idle", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lms, levels = args.lms.split(","), [int(c) for c in args.concurrency.split(",")]
    proc, url = None, args.backend_url
    if any(name.startswith("backend") for name in lms) and not url:
        prefix = ("chrt", "--idle", "0") if args.backend_idle else ()
        extra = ("--cpus", args.backend_cpus) if args.backend_cpus else ()
        extra += ("--nice", str(args.backend_nice)) if args.backend_nice else ()
        proc, url = start_backend(args.model_dir, 8124, args.api_key, extra, prefix)
    try:
        cache = speech_cache_mb(args, "cpu")  # app.py's rule, so the engines hold what a frontend's do
        line = Timeline()
        engines, schedulers = {}, {}
        for name in lms:
            remote = {}
            if name.startswith("backend"):  # backend-off: one request per sentence (--llm_split_first_chunk off)
                remote = {"llm_base_url": url, "llm_api_key": args.api_key,
                          "llm_split_first_chunk": "off" if name == "backend-off" else "auto"}
            e = engines[name] = Engine.from_model_dir(args.model_dir, cache_mb=cache, **remote)
            e.lm = TimedLM(FixedLengthLM(e.lm, args.tokens), line)
            schedulers[name] = SpeechScheduler()  # a worker's: one runner, first chunks first, no batching
            e.speech_runner = TimedRunner(schedulers[name], line)
        voice = engines[lms[0]].prompt_features(PROMPT_WAV)
        for name, e in engines.items():
            one(e, line, schedulers[name], voice, 0)  # warm-up (and the saved voice's prompt state)
        runs = {(name, n): [] for name in engines for n in levels}
        for r in range(args.repeats):  # alternated, so a drifting machine affects every case alike
            for n in levels:
                for name, e in engines.items():
                    runs[name, n] += level(e, line, schedulers[name], voice, n, 100 * r + 10 * n)
        print(f"{args.tokens} tokens, a saved voice, streaming; medians over requests and {args.repeats} "
              f"repeats; seconds since the request started")
        for (name, n), got in runs.items():
            report(name, n, got)
    finally:
        if proc is not None:
            import signal
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)


if __name__ == "__main__":
    main()
