"""First-packet latency of duplex synthesis: text streamed in at an LLM's rate vs the whole text at once.

    python bench/duplex.py [--model_dir DIR] [--rate 20] [--runs 3] [--modes streamed,whole,http]
                           [--llm_base_url URL --llm_api_key KEY]

One worker process (`WorkerPool`, embedded LM unless --llm_base_url), a saved voice (assets/zero_shot_prompt.wav,
features computed once), the same text three ways:
  streamed  duplex, the text put in one character (about one token for Chinese) every 1/--rate s;
            first packet measured from the first piece
  whole     duplex, the whole text in one piece, then its end
  http      the ordinary streaming request (the HTTP APIs' path), for contrast
Each run stops after its first audio chunk (the job is cancelled). Full-size random model by default (built
once into .cache/full-random); its LM never picks eos, so only first packets are meaningful here.
"""
from __future__ import annotations

import argparse
import queue
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from voice_prompt import PROMPT_TEXT, PROMPT_WAV  # noqa: E402

from cosy.pipeline.request import SynthesisRequest  # noqa: E402
from cosy.service.workers import EngineSpec, WorkerPool  # noqa: E402

TEXT = "收到好友从远方寄来的生日礼物，那份意外的惊喜与深深的祝福让我心中充满了甜蜜的快乐，笑容如花儿般绽放。"


def first_packet(pool: WorkerPool, voice, how: str, rate: float, seed: int) -> float:
    req = SynthesisRequest(mode="voice", prompt_text=PROMPT_TEXT, voice=voice, seed=seed, stream=True,
                           duplex=how != "http", text=TEXT if how == "http" else "")
    text: queue.Queue = queue.Queue()
    start = time.monotonic()
    if how == "http":
        chunks = pool.synthesize(req)
    else:
        chunks = pool.synthesize_duplex(req, text)
        if how == "whole":
            text.put(TEXT)
            text.put(None)
        else:
            def feed() -> None:
                for ch in TEXT:
                    text.put(ch)
                    time.sleep(1 / rate)
                text.put(None)
            threading.Thread(target=feed, daemon=True).start()
    try:
        next(iter(chunks))
        return time.monotonic() - start
    finally:
        chunks.close()  # cancels the rest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model_dir", type=Path)
    ap.add_argument("--rate", type=float, default=20.0, help="streamed text: characters (~tokens) per second")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--modes", default="streamed,whole,http")
    ap.add_argument("--llm_base_url", default=None)
    ap.add_argument("--llm_api_key", default=None)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    from cosy.verify.random_model import write_random_model
    model_dir = args.model_dir or ROOT / ".cache" / "full-random"
    if not (model_dir / "llm.pt").exists():
        write_random_model(model_dir, "full", seed=0)
    lm = args.llm_base_url or "embedded LM"
    print(f"model {model_dir}; {lm}; text {len(TEXT)} characters; streamed at {args.rate:g}/s; {args.runs} runs")
    pool = WorkerPool(EngineSpec(str(model_dir), llm_base_url=args.llm_base_url, llm_api_key=args.llm_api_key,
                                 threads=args.threads), workers=1).start()
    try:
        voice = pool.prompt_features(str(PROMPT_WAV))
        modes = args.modes.split(",")
        first_packet(pool, voice, modes[0], args.rate, 0)  # warm-up
        for how in modes:
            times = [first_packet(pool, voice, how, args.rate, seed) for seed in range(1, args.runs + 1)]
            print(f"{how:9s} first packet: median {statistics.median(times):6.2f} s  "
                  f"(min {min(times):.2f}, max {max(times):.2f})", flush=True)
    finally:
        pool.close()


if __name__ == "__main__":
    main()
