"""The forced aligner's cost (`--aligner`, cosy.align): ms of aligner work per second of audio, on the CPU, at
the published size (MMS-300m, random weights) and at the tiny test size.

    python bench/aligner.py [--sizes full,tiny] [--seconds 3,10] [--repeats 5] [--threads N] [--json OUT]

For each size and sentence length: one sentence of that much audio (noise at 24 kHz, the engine's rate) and a
text of about as many words as speech has in that time (3 English words and 4 Chinese characters a second),
aligned as a worker does (`fill_words`: resample to 16 kHz, the model's emissions, the Viterbi path, words).
Figures: the median over --repeats of wall and CPU ms (CPU: this process, all its threads) per second of
audio, and the share of the model in the wall time. The random-weight directories are written by our builder
into a temporary directory (the full one is 1.2 GB). The first run of each size is a warm-up, not counted.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

SAMPLE_RATE = 24000
WORDS = "the day was good and we went home after a long walk by the river".split()
HANZI = "今天天气很好我们回家了走在河边的路上"


def sentence_text(seconds: float) -> str:
    """About as many words as a speaker says in `seconds`: half English words, half Chinese characters."""
    n = max(1, round(seconds * 3.5))
    en = " ".join(WORDS[i % len(WORDS)] for i in range(n // 2))
    zh = "".join(HANZI[i % len(HANZI)] for i in range(n - n // 2))
    return f"{en} {zh}"


def measure(model_dir: Path, seconds: list[float], repeats: int) -> list[dict]:
    import numpy as np

    from cosy.align.aligner import Aligner, fill_words
    from cosy.pipeline.timing import SentenceTiming

    aligner = Aligner.load(model_dir)
    rng = np.random.default_rng(0)
    rows = []
    for secs in seconds:
        audio = rng.normal(0, 0.1, int(secs * SAMPLE_RATE)).astype(np.float32)
        text = sentence_text(secs)
        sentence = SentenceTiming(0, text, 0, len(text), 0, audio.size, SAMPLE_RATE)
        fill_words(aligner, sentence, audio)  # warm-up (and uroman's tables)
        wall, cpu, model = [], [], []
        for _ in range(repeats):
            t0, c0 = time.perf_counter(), time.process_time()
            fill_words(aligner, sentence, audio)
            wall.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            t0 = time.perf_counter()
            aligner.emissions(audio, SAMPLE_RATE)
            model.append(time.perf_counter() - t0)
        rows.append({"audio_s": secs, "words": len(sentence.words),
                     "wall_ms_per_audio_s": round(statistics.median(wall) * 1000 / secs, 1),
                     "cpu_ms_per_audio_s": round(statistics.median(cpu) * 1000 / secs, 1),
                     "model_share": round(statistics.median(model) / statistics.median(wall), 2)})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="full,tiny", help="builder sizes to measure (default full,tiny)")
    p.add_argument("--seconds", default="3,10", help="sentence lengths in seconds of audio (default 3,10)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per figure; the median is shown (default 5)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    p.add_argument("--json", default=None, help="also write the results and their provenance here")
    args = p.parse_args(argv)
    import torch
    from provenance import provenance

    from cosy.verify.random_model import write_random_model
    if args.threads:
        torch.set_num_threads(args.threads)
    info = {**provenance(), "threads": torch.get_num_threads(), "results": {}}
    seconds = [float(s) for s in args.seconds.split(",")]
    for size in args.sizes.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            model_dir = write_random_model(Path(tmp) / size, size, seed=0, family="mms-aligner")
            rows = measure(model_dir, seconds, args.repeats)
        info["results"][size] = rows
        for r in rows:
            print(f"{size:>4} {r['audio_s']:>5g} s of audio, {r['words']:>3} words: "
                  f"{r['wall_ms_per_audio_s']:>7.1f} ms wall, {r['cpu_ms_per_audio_s']:>7.1f} ms CPU per second of "
                  f"audio (model {r['model_share']:.0%})",
                  flush=True)
    print(json.dumps({k: v for k, v in info.items() if k != "results"}))
    if args.json:
        Path(args.json).write_text(json.dumps(info, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
