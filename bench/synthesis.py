"""Benchmark the in-process pipeline (embedded LM) with fixed token counts; prints the figures the official
pipeline was measured with (ENVIRONMENT.md), so the two can be compared.

    python bench/synthesis.py [--model_dir DIR | --family cosyvoice2|cosyvoice3] [--tokens 100] [--repeats 3]
                              [--threads 2] [--concurrency 2,4]
                              [--device cuda --dtype bfloat16 --no_tf32]
                              [--dtypes float32,bfloat16 [--json OUT]]

--dtypes: instead, one engine per dtype, measured in turn (the order flips every repeat): the zero-shot
stages (LM, flow, HiFT), a whole utterance and a stream (first chunk, RTF); medians and the ratio to the
first dtype; --json OUT writes them with `provenance()`.

Without --model_dir a full-size random model of --family (default cosyvoice2) is built once into
.cache/full-random or .cache/full-random-cv3 (2-3 GB).
Random weights make random tokens, so the LM is told to produce exactly --tokens tokens (stop tokens
masked); prompt: assets/zero_shot_prompt.wav (3.5 s).
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from devices import add_device_args, check_device_args, peak_gpu, sync  # noqa: E402
from models import add_model_args, model_dir  # noqa: E402
from voice_prompt import PROMPT_TEXT, PROMPT_WAV, TEXT  # noqa: E402

from cosy.lm.fixed_length import FixedLengthLM  # noqa: E402,F401  (bench/frontend.py imports it from here)
from cosy.model.precision import cpu_bf16_units, describe, resolve_dtype  # noqa: E402
from cosy.pipeline.engine import Engine, SynthesisRequest  # noqa: E402
from cosy.pipeline.token2wav import FlowPrompt  # noqa: E402

MODES = {
    "zero_shot": dict(prompt_text=PROMPT_TEXT, prompt_wav=PROMPT_WAV),
    "cross_lingual": dict(prompt_wav=PROMPT_WAV),
    "instruct": dict(prompt_wav=PROMPT_WAV),  # the family's first WebUI example instruction (request())
    "voice": dict(prompt_text=PROMPT_TEXT),  # features computed once, as for a saved voice
}


def request(engine: Engine, mode: str, stream: bool, voice) -> SynthesisRequest:
    kw = dict(MODES[mode])
    if mode == "instruct":
        kw["instruct_text"] = engine.family.instruct_examples[0]
    if mode == "voice":
        kw["voice"] = voice
    return SynthesisRequest(mode=mode, text=TEXT, stream=stream, seed=0, **kw)


def run_once(engine: Engine, req: SynthesisRequest) -> tuple[float, float, float]:
    """(first chunk s, total s, audio s) of one request through the engine."""
    start, first, samples = time.perf_counter(), None, 0
    for chunk in engine.synthesize(req):
        first = first or time.perf_counter() - start
        samples += chunk.numel()
    return first, time.perf_counter() - start, samples / engine.sample_rate


def stages(engine: Engine, n: int) -> dict[str, float]:
    """Non-streaming zero-shot split by stage: prompt features, LM, flow, HiFT (seconds)."""
    t0 = time.perf_counter()
    feats = engine.prompt_features(PROMPT_WAV)
    text_ids = engine.text.segments(TEXT)[0][1]
    prompt_ids = engine.text.encode(engine.text.normalize(PROMPT_TEXT, split=False)[0])
    embeds = engine._prompt_embeds(text_ids, prompt_ids, feats.speech_tokens.flatten().tolist())
    t1 = time.perf_counter()
    tokens = list(engine.lm.generate(embeds, n, n, seed=0))
    t2 = time.perf_counter()
    mel = engine.t2w.mel(torch.tensor([tokens], dtype=torch.int32),
                         FlowPrompt(feats.speech_tokens, feats.mel, feats.embedding))
    sync(mel.device)
    t3 = time.perf_counter()
    engine.t2w.vocode(mel, seed=0)
    t4 = time.perf_counter()
    return {"prompt": t1 - t0, "lm": t2 - t1, "flow": t3 - t2, "hift": t4 - t3}


def concurrent(engine: Engine, n_requests: int, voice) -> float:
    """Audio seconds produced per wall second with n concurrent non-streaming zero-shot requests."""
    audio = [0.0] * n_requests

    def work(i: int) -> None:
        audio[i] = run_once(engine, request(engine, "zero_shot", False, voice))[2]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_requests)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(audio) / (time.perf_counter() - start)


def compare_dtypes(args: argparse.Namespace, directory: Path, dtypes: list[str]) -> None:
    """The engine in each of `dtypes` side by side (see the module doc)."""
    engines = {}
    for dt in dtypes:
        engine = Engine.from_model_dir(directory, device=args.device, dtype=dt, tf32=args.tf32)
        engine.lm = FixedLengthLM(engine.lm, args.tokens)
        engines[dt] = engine
    print(f"model {directory}; {args.tokens} tokens; {args.device}, threads {args.threads}, dtypes "
          f"{', '.join(dtypes)} ({describe(dtypes[-1], args.device)}); medians of {args.repeats}, alternating",
          flush=True)
    voice = engines[dtypes[0]].prompt_features(PROMPT_WAV)
    for engine in engines.values():
        run_once(engine, request(engine, "zero_shot", False, voice))  # warm-up
        run_once(engine, request(engine, "zero_shot", True, voice))
    runs: dict[str, list[dict]] = {dt: [] for dt in dtypes}
    for i in range(args.repeats):
        for dt in dtypes if i % 2 == 0 else dtypes[::-1]:
            engine = engines[dt]
            st = stages(engine, args.tokens)
            _, whole, audio = run_once(engine, request(engine, "zero_shot", False, voice))
            first, total, saudio = run_once(engine, request(engine, "zero_shot", True, voice))
            runs[dt].append({**st, "whole_s": whole, "rtf": whole / audio, "stream_first_s": first,
                             "stream_rtf": total / saudio})
            print(f"  repeat {i} {dt}: " + ", ".join(f"{k} {v:.2f}" for k, v in runs[dt][-1].items()), flush=True)
    med = {dt: {k: statistics.median(r[k] for r in runs[dt]) for k in runs[dt][0]} for dt in dtypes}
    keys = list(med[dtypes[0]])
    print(f"{'':<16}" + "".join(f"{dt:>10}" for dt in dtypes) + "".join(f"{dt + '/' + dtypes[0]:>20}"
                                                                        for dt in dtypes[1:]))
    for k in keys:
        print(f"{k:<16}" + "".join(f"{med[dt][k]:>10.3f}" for dt in dtypes)
              + "".join(f"{med[dt][k] / med[dtypes[0]][k]:>20.2f}" for dt in dtypes[1:]))
    if args.json:
        from provenance import provenance
        args.json.write_text(json.dumps({
            "provenance": provenance(), "bench": "synthesis", "tokens": args.tokens, "threads": args.threads,
            "device": args.device, "repeats": args.repeats, "cpu_bf16_units": cpu_bf16_units(),
            "lm_kernels": {dt: getattr(engines[dt].lm.lm, "kernels", None) for dt in dtypes},
            "medians": med, "runs": runs}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(ap)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--concurrency", default="2,4")
    ap.add_argument("--dtypes", help="compare these dtypes side by side (comma-separated) instead")
    ap.add_argument("--json", type=Path, help="with --dtypes: write the results and their provenance here")
    add_device_args(ap)
    args = ap.parse_args()
    check_device_args(ap, args)
    torch.set_num_threads(args.threads)
    directory = model_dir(ap, args)
    if args.dtypes:
        dtypes = args.dtypes.split(",")
        for dt in dtypes:
            try:
                resolve_dtype(dt, args.device)
            except ValueError as e:
                ap.error(f"--dtypes: {e}")
        return compare_dtypes(args, directory, dtypes)
    t = time.perf_counter()
    engine = Engine.from_model_dir(directory, device=args.device, dtype=args.dtype, tf32=args.tf32)
    engine.lm = FixedLengthLM(engine.lm, args.tokens)
    print(f"model {directory} ({engine.family.display_name}) loaded in {time.perf_counter() - t:.1f} s on "
          f"{args.device} ({args.dtype}{', TF32' if args.tf32 and args.device.startswith('cuda') else ''}); "
          f"{args.tokens} tokens = {args.tokens / engine.family.token_frame_rate:.1f} s of audio; "
          f"threads {args.threads}; medians of {args.repeats}")
    voice = engine.prompt_features(PROMPT_WAV)
    run_once(engine, request(engine, "zero_shot", False, voice))  # warm-up

    st = [stages(engine, args.tokens) for _ in range(args.repeats)]
    med = {k: statistics.median(s[k] for s in st) for k in st[0]}
    print(f"zero_shot stages: prompt {med['prompt']:.2f} s, LM {med['lm']:.2f} s "
          f"({args.tokens / med['lm']:.1f} tokens/s), flow {med['flow']:.2f} s, HiFT {med['hift']:.2f} s")
    print(f"{'mode':<14} {'RTF':>6} {'stream 1st chunk':>17} {'stream RTF':>11}")
    for mode in MODES:
        full = [run_once(engine, request(engine, mode, False, voice)) for _ in range(args.repeats)]
        live = [run_once(engine, request(engine, mode, True, voice)) for _ in range(args.repeats)]
        rtf = statistics.median(total / audio for _, total, audio in full)
        first = statistics.median(f for f, _, _ in live)
        srtf = statistics.median(total / audio for _, total, audio in live)
        print(f"{mode:<14} {rtf:>6.2f} {first:>15.2f} s {srtf:>11.2f}", flush=True)
    for n in (int(c) for c in args.concurrency.split(",") if c):
        print(f"{n} concurrent zero_shot: {concurrent(engine, n, voice):.3f} audio s per wall s", flush=True)
    print(f"peak memory (RSS): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GB")
    if peak_gpu(args.device):
        print(peak_gpu(args.device))


if __name__ == "__main__":
    main()
