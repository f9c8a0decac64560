"""Streaming cost against the utterance's length: 10, 30 and 60 s of audio streamed, same run.

    python bench/stream_length.py [--stage vocoder|token2wav] [--families cosyvoice2,cosyvoice3]
                                  [--seconds 10,30,60] [--cache_mb 4096] [--threads 2] [--model_dir DIR]
                                  [--json OUT]

--stage token2wav (default): the speech half as the engine runs it (`Token2Wav.stream` with a flow state
budget: the incremental flow of both families), fed seeded random speech tokens 25 at a time (what the LM
would stream), with the saved-voice features of assets/zero_shot_prompt.wav. --stage vocoder: the stream
vocoder alone, fed a seeded mel 50 frames (one official CosyVoice3 hop) at a time (the full-size flow on
2 CPU cores takes ~12 s per audio second and would hide the vocoder). Full-size random models
(bench/models.py). CosyVoice3 runs twice: "official" = `RevocodeVocoder` (re-vocodes the whole mel at every
chunk, as main did before `CausalStreamVocoder`) and "linear" = `CausalStreamVocoder`; both streams' chunks
are compared. Prints total seconds, seconds per audio second and the last / first length ratio of the
latter (1.0 = linear).
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
from voice_prompt import PROMPT_WAV  # noqa: E402

from cosy.pipeline.engine import Engine  # noqa: E402
from cosy.pipeline.stream_vocoder import CausalStreamVocoder, RevocodeVocoder  # noqa: E402
from cosy.pipeline.token2wav import FlowPrompt  # noqa: E402

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


def vocode(engine: Engine, mel: torch.Tensor) -> tuple[float, list[torch.Tensor]]:
    """(seconds, chunks) of the family's stream vocoder over `mel` (1, 80, T), 50 frames at a time."""
    start = time.perf_counter()
    v = engine.t2w.stream_vocoder(engine.t2w.hift, torch.Generator().manual_seed(0), engine.t2w.window)
    chunks = [v.push(mel[:, :, i:i + 50], i + 50 >= mel.shape[2]) for i in range(0, mel.shape[2], 50)]
    return time.perf_counter() - start, chunks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(ap)
    ap.add_argument("--stage", choices=("token2wav", "vocoder"), default="token2wav")
    ap.add_argument("--families", default="cosyvoice2,cosyvoice3")
    ap.add_argument("--seconds", default="10,30,60")
    ap.add_argument("--vocoders", default="official,linear",
                    help="CosyVoice3's paths to run (the official one is slow past 30 s: its cost is quadratic)")
    ap.add_argument("--cache_mb", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, help="also write the results here (the docs' performance page reads "
                    "docs/performance/stream_length*.json)")
    args = ap.parse_args()
    series: dict[str, list[dict]] = {}
    from provenance import provenance
    measured_on = provenance()  # at the start: the machine's load before this run adds its own
    torch.set_num_threads(args.threads)
    lengths = [int(s) for s in args.seconds.split(",")]
    for family in args.families.split(","):
        args.family = family if args.model_dir is None else args.family
        if family not in DEFAULT_DIRS:
            ap.error(f"unknown family {family}")
        engine = Engine.from_model_dir(model_dir(ap, args), cache_mb=args.cache_mb)
        feats = engine.prompt_features(PROMPT_WAV)
        prompt = FlowPrompt(feats.speech_tokens, feats.mel, feats.embedding)
        paths = {name: {"official": RevocodeVocoder, "linear": CausalStreamVocoder}[name]
                 for name in args.vocoders.split(",")} if family == "cosyvoice3" else \
            {"crossfade": engine.t2w.stream_vocoder}
        g = torch.Generator().manual_seed(0)
        per_second: dict[str, list[float]] = {name: [] for name in paths}
        for i, seconds in enumerate([lengths[0], *lengths]):  # the first: warm-up at the first length, not shown
            if args.stage == "vocoder":
                mel = torch.randn(1, 80, seconds * 50, generator=g) * 0.8 - 4
            else:
                tokens = torch.randint(0, 4096, (seconds * TOKENS_PER_SECOND,), generator=g).tolist()
            outs = {}
            for name, vocoder in paths.items():
                engine.t2w.stream_vocoder = vocoder
                took, chunks = vocode(engine, mel) if args.stage == "vocoder" else stream(engine, prompt, tokens)
                if i == 0:
                    continue
                audio = sum(c.numel() for c in chunks) / engine.sample_rate
                per_second[name].append(took / audio)
                series.setdefault(f"{family} {name}", []).append({"seconds": seconds, "cost_per_audio_s": took / audio})
                outs[name] = chunks
                print(f"{family:<11} {args.stage:<9} {name:<9} {audio:6.1f} s of audio: {took:7.1f} s streaming, "
                      f"{took / audio:.3f} s per audio s", flush=True)
            if len(outs) == 2 and i > 0:
                a, b = outs.values()
                diff = max(float((x - y).abs().max()) for x, y in zip(a, b) if x.numel())
                print(f"{family:<11} chunks equal: {[x.numel() for x in a] == [y.numel() for y in b]}, "
                      f"max abs difference {diff:.2e}", flush=True)
        for name, values in per_second.items():
            print(f"{family:<11} {args.stage:<9} {name:<9} cost per audio second, {lengths[-1]} s / {lengths[0]} s: "
                  f"{values[-1] / values[0]:.2f}")
    if args.json:
        import json

        report = {"provenance": measured_on, "args": {k: str(v) for k, v in vars(args).items()}, "series": series}
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
