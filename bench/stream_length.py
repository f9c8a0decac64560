"""Streaming cost against the utterance's length: token2wav streaming of 10, 30 and 60 s of audio, same run.

    python bench/stream_length.py [--families cosyvoice2,cosyvoice3] [--seconds 10,30,60] [--cache_mb 4096]
                                  [--threads 2] [--model_dir DIR]

The speech half only, as the engine runs it (`Token2Wav.stream` with a flow state budget: the incremental
flow of both families), fed seeded random speech tokens 25 at a time (what the LM would stream), with the
saved-voice features of assets/zero_shot_prompt.wav; full-size random models (bench/models.py). CosyVoice3
runs twice: "official" = `RevocodeVocoder` (re-vocodes the whole mel at every chunk, today's main before
`CausalStreamVocoder`) and "linear" = `CausalStreamVocoder`; both streams' chunks are compared. Prints total
seconds, seconds per audio second and the 60 s / 10 s ratio of the latter (1.0 = linear).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from models import DEFAULT_DIRS, add_model_args, model_dir  # noqa: E402

from cosy.pipeline.engine import Engine  # noqa: E402
from cosy.pipeline.stream_vocoder import CausalStreamVocoder, RevocodeVocoder  # noqa: E402
from cosy.pipeline.token2wav import FlowPrompt  # noqa: E402

PROMPT_WAV = ROOT / "assets" / "zero_shot_prompt.wav"
TOKENS_PER_SECOND = 25  # both families' speech token rate
PIECE = 25  # tokens per LM delivery


def stream(engine: Engine, prompt: FlowPrompt, tokens: list[int]) -> tuple[float, list[torch.Tensor]]:
    """(seconds, chunks) of one streaming token2wav run over `tokens`."""
    start = time.perf_counter()
    s = engine.t2w.stream(prompt, speed=1.0)
    chunks = []
    for i in range(0, len(tokens), PIECE):
        chunks += s.push(tokens[i:i + PIECE])
    chunks.append(s.finish())
    return time.perf_counter() - start, chunks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(ap)
    ap.add_argument("--families", default="cosyvoice2,cosyvoice3")
    ap.add_argument("--seconds", default="10,30,60")
    ap.add_argument("--cache_mb", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lengths = [int(s) for s in args.seconds.split(",")]
    for family in args.families.split(","):
        args.family = family if args.model_dir is None else args.family
        if family not in DEFAULT_DIRS:
            ap.error(f"unknown family {family}")
        engine = Engine.from_model_dir(model_dir(ap, args), cache_mb=args.cache_mb)
        feats = engine.prompt_features(PROMPT_WAV)
        prompt = FlowPrompt(feats.speech_tokens, feats.mel, feats.embedding)
        paths = {"official": RevocodeVocoder, "linear": CausalStreamVocoder} if family == "cosyvoice3" else \
            {"crossfade": engine.t2w.stream_vocoder}
        g = torch.Generator().manual_seed(0)
        stream(engine, prompt, torch.randint(0, 4096, (50,), generator=g).tolist())  # warm-up
        per_second: dict[str, list[float]] = {name: [] for name in paths}
        for seconds in lengths:
            tokens = torch.randint(0, 4096, (seconds * TOKENS_PER_SECOND,), generator=g).tolist()
            outs = {}
            for name, vocoder in paths.items():
                engine.t2w.stream_vocoder = vocoder
                took, chunks = stream(engine, prompt, tokens)
                audio = sum(c.numel() for c in chunks) / engine.sample_rate
                per_second[name].append(took / audio)
                outs[name] = chunks
                print(f"{family:<11} {name:<9} {audio:6.1f} s of audio: {took:7.1f} s streaming, "
                      f"{took / audio:.3f} s per audio s", flush=True)
            if len(outs) == 2:
                a, b = outs.values()
                diff = max(float((x - y).abs().max()) for x, y in zip(a, b) if x.numel())
                print(f"{family:<11} chunks equal: {[x.numel() for x in a] == [y.numel() for y in b]}, "
                      f"max abs difference {diff:.2e}", flush=True)
        for name, values in per_second.items():
            print(f"{family:<11} {name:<9} cost per audio second, {lengths[-1]} s / {lengths[0]} s: "
                  f"{values[-1] / values[0]:.2f}")


if __name__ == "__main__":
    main()
