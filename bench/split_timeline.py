"""Where a one-machine split's first packet goes: one streaming request, timed token by token, with the LM
embedded and on a backend, in one process (no HTTP frontend, no worker: only the LM's place differs).

    python bench/split_timeline.py [--model_dir DIR] [--tokens 100] [--repeats 3] [--threads 2]
        [--speech_cache_mb 2048] [--backend_url URL | --backend_cpus LIST --backend_nice N --backend_idle]

Prints, per LM and as medians of --repeats: when the first token and the token the first chunk waits for
arrived, when the first chunk was ready (so how long its flow and HiFT took), and the whole request. Without
--backend_url a backend is started on the model (`launch/backend.py`). --speech_cache_mb: the engines' flow
state budget, by default app.py's on the CPU (2048 MB: the saved voice's prompt chunks are computed once, not
per request).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from lm_throughput import start_backend  # noqa: E402
from synthesis import PROMPT_TEXT, PROMPT_WAV, TEXT  # noqa: E402

from cosy.frontend.server import speech_cache_mb  # noqa: E402
from cosy.lm.fixed_length import FixedLengthLM  # noqa: E402
from cosy.pipeline.engine import Engine, SynthesisRequest  # noqa: E402


class Timed:
    """The LM with each yielded token's time (seconds since `start`) recorded."""

    def __init__(self, lm):
        self.lm, self.sampling, self.times, self.start = lm, lm.sampling, [], 0.0

    def generate(self, *args, **kwargs):
        for token in self.lm.generate(*args, **kwargs):
            self.times.append(time.perf_counter() - self.start)
            yield token


def one(engine: Engine, timed: Timed, voice) -> dict[str, float]:
    req = SynthesisRequest(mode="voice", text=TEXT, prompt_text=PROMPT_TEXT, voice=voice, stream=True, seed=0)
    timed.times, timed.start = [], time.perf_counter()
    first = None
    for _ in engine.synthesize(req):
        first = first or time.perf_counter() - timed.start
    total = time.perf_counter() - timed.start
    n, hop = voice.speech_tokens.shape[1], engine.t2w.hop_len  # the tokens the first chunk waits for
    need = hop + (-n) % hop + engine.t2w.lookahead
    t = timed.times
    return {"token1": t[0], "token_need": t[min(need, len(t)) - 1], "first": first, "total": total,
            "flow": first - t[min(need, len(t)) - 1]}


def report(name: str, runs: list[dict[str, float]]) -> None:
    m = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"{name:<9} token 1 {m['token1']:6.2f} s  first-chunk token {m['token_need']:6.2f} s  first chunk "
          f"{m['first']:6.2f} s (its flow+HiFT {m['flow']:5.2f} s)  "
          f"total {m['total']:6.2f} s", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model_dir", type=Path, default=ROOT / ".cache" / "full-random")
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--speech_cache_mb", type=int, default=None, help="default: app.py's on the CPU")
    ap.add_argument("--backend_url")
    ap.add_argument("--api_key", default=os.environ.get("COSY_LLM_API_KEY", "bench-key"))
    ap.add_argument("--backend_cpus")
    ap.add_argument("--backend_nice", type=int, default=0)
    ap.add_argument("--backend_idle", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    proc, url = None, args.backend_url
    if not url:
        prefix = ("chrt", "--idle", "0") if args.backend_idle else ()
        extra = ("--cpus", args.backend_cpus) if args.backend_cpus else ()
        extra += ("--nice", str(args.backend_nice)) if args.backend_nice else ()
        proc, url = start_backend(args.model_dir, 8124, args.api_key, extra, prefix)
    try:
        cache = speech_cache_mb(args, "cpu")  # app.py's rule, so the engines hold what a frontend's do
        engines = {"embedded": Engine.from_model_dir(args.model_dir, cache_mb=cache),
                   "backend": Engine.from_model_dir(args.model_dir, cache_mb=cache, llm_base_url=url,
                                                    llm_api_key=args.api_key)}
        timed = {}
        for name, e in engines.items():
            timed[name] = e.lm = Timed(FixedLengthLM(e.lm, args.tokens))
        voice = engines["embedded"].prompt_features(PROMPT_WAV)
        for name, e in engines.items():
            one(e, timed[name], voice)  # warm-up
        runs = {name: [] for name in engines}
        for _ in range(args.repeats):  # alternated, so a drifting machine affects both alike
            for name, e in engines.items():
                runs[name].append(one(e, timed[name], voice))
        print(f"{args.tokens} tokens, a saved voice, streaming; medians of {args.repeats}")
        for name in engines:
            report(name, runs[name])
    finally:
        if proc is not None:
            import signal
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)


if __name__ == "__main__":
    main()
