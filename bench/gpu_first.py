"""The GPU check's first minute: every mode through the speech engine's worker pool, then a saved voice at 1, 4
and 8 concurrent streams, per dtype, with the worker's peak GPU memory.

    python bench/gpu_first.py --model_dir DIR [--device cuda] [--dtypes float32,bfloat16] [--tokens 100]
                              [--concurrency 1,4,8] [--max_batch 8] [--cache_mb 4096] [--threads 2]
                              [--lm_batch 8] [--skip_modes]

Per dtype, one worker process as the app runs it (`WorkerPool`, the speech engine: --max_batch live requests,
the incremental flow with a --cache_mb state budget, flow batching as the app's device default), embedded LM
made to produce exactly --tokens speech tokens (random weights rarely stop). It prints:
- each mode of the family (zero_shot, cross_lingual, instruct, voice, vc), streamed once: ok or the error,
  first chunk, RTF;
- the saved voice, streaming, N requests at once: first chunk p50/p95, RTF p50, audio seconds per wall second;
- the worker's peak memory: on CUDA torch's peak allocated and reserved in the worker (what the caching
  allocator held; the CUDA context comes on top), and the card's used memory (NVML) at its highest;
  on the CPU the worker's peak RSS.
Exit status 1 if any request failed.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from frontend import PROMPT_TEXT, PROMPT_WAV, TEXT, measure, peak_rss_mib  # noqa: E402

from cosy.model.precision import DTYPES  # noqa: E402
from cosy.pipeline.request import MODES, SynthesisRequest  # noqa: E402
from cosy.service.workers import EngineSpec, WorkerPool  # noqa: E402

SOURCE_WAV = ROOT / "assets" / "cross_lingual_prompt.wav"  # mode vc: the speech converted


def report_memory(engine, memory_file: str) -> None:
    """Runs in the worker (on CUDA): a thread writing torch's peak GPU memory to a file every 0.5 s."""
    import torch

    if not str(engine.t2w.device).startswith("cuda"):
        return

    def report() -> None:
        while True:
            Path(memory_file).write_text(json.dumps({
                "allocated": torch.cuda.max_memory_allocated(), "reserved": torch.cuda.max_memory_reserved()}))
            time.sleep(0.5)

    threading.Thread(target=report, daemon=True).start()


class CardMemory:
    """The card's used memory at its highest while it runs (NVML, sampled every 0.2 s); None without NVML."""

    def __init__(self, device: str):
        self.peak, self._stop = None, threading.Event()
        try:
            import pynvml
            pynvml.nvmlInit()
            index = int(device.split(":")[1]) if ":" in device else 0
            self._handle, self._nvml = pynvml.nvmlDeviceGetHandleByIndex(index), pynvml
        except Exception:
            self._handle = None
            return
        self.peak = 0
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
            time.sleep(0.2)

    def stop(self) -> int | None:
        self._stop.set()
        return self.peak


def mode_request(mode: str, voice, instruct: str) -> SynthesisRequest:
    kw = {"zero_shot": dict(prompt_text=PROMPT_TEXT, prompt_wav=str(PROMPT_WAV)),
          "cross_lingual": dict(prompt_wav=str(PROMPT_WAV)),
          "instruct": dict(prompt_wav=str(PROMPT_WAV), instruct_text=instruct),
          "voice": dict(voice=voice, prompt_text=PROMPT_TEXT),
          "vc": dict(prompt_wav=str(PROMPT_WAV), source_wav=str(SOURCE_WAV))}[mode]
    return SynthesisRequest(mode=mode, text=TEXT if mode != "vc" else "", stream=True, seed=0, **kw)


def run_modes(pool: WorkerPool, voice, instruct: str) -> bool:
    ok = True
    for mode in MODES:
        start, first, audio = time.perf_counter(), None, 0.0
        try:
            for chunk in pool.synthesize(mode_request(mode, voice, instruct)):
                first = first or time.perf_counter() - start
                audio += chunk.size / pool.sample_rate
            total = time.perf_counter() - start
            print(f"  {mode:<14} ok    first chunk {first:6.3f} s  RTF {total / audio:6.3f}  ({audio:.1f} s audio)",
                  flush=True)
        except Exception as e:
            ok = False
            print(f"  {mode:<14} FAILED {type(e).__name__}: {e}", flush=True)
    return ok


def run_dtype(args, dtype: str, levels: list[int]) -> bool:
    from cosy.model.files import ModelDir
    family = ModelDir(args.model_dir).family
    memory_file = str(Path(tempfile.gettempdir()) / f"cosy-gpu-first-{os.getpid()}-{dtype}.json")
    spec = EngineSpec(str(args.model_dir), device=args.device, dtype=dtype, threads=args.threads,
                      max_batch=args.max_batch, flow_batch=8 if args.device.startswith("cuda") else 1,
                      cache_mb=args.cache_mb, fixed_tokens=args.tokens, lm_batch=args.lm_batch)
    card = CardMemory(args.device) if args.device.startswith("cuda") else None
    t0 = time.perf_counter()
    pool = WorkerPool(spec, workers=1, max_queue=64)
    pool.worker_prepare = functools.partial(report_memory, memory_file=memory_file)
    try:
        pool.start()
    except RuntimeError as e:  # the worker could not load or start: say so, go on with the next dtype
        print(f"{family.display_name} {dtype}: FAILED to start the worker: {e}", flush=True)
        pool.close()
        if card is not None:
            card.stop()
        return False
    print(f"{family.display_name} {dtype}: worker ready in {time.perf_counter() - t0:.1f} s "
          f"(max_batch {spec.max_batch}, flow_batch {spec.flow_batch}, cache {spec.cache_mb} MiB, lm_batch "
          f"{spec.lm_batch})", flush=True)
    ok = True
    try:
        voice = pool.prompt_features(str(PROMPT_WAV))
        ok = args.skip_modes or run_modes(pool, voice, family.instruct_examples[0])
        if args.skip_modes:
            measure(pool, voice, 1)  # warm-up (the modes warm it otherwise)
        for n in levels:
            try:
                r = measure(pool, voice, n)
            except SystemExit as e:  # every request failed
                print(f"  saved voice x{n}: FAILED ({e})", flush=True)
                ok = False
                continue
            ok = ok and not r["failed"]
            print(f"  saved voice x{n}: first chunk p50 {r['fp50']:.3f} s p95 {r['fp95']:.3f} s, RTF p50 "
                  f"{r['rtf']:.3f}, {r['agg']:.2f} audio s per wall s, failed {r['failed']}", flush=True)
        time.sleep(0.6)  # the worker's last report
        if os.path.exists(memory_file):
            m = json.loads(Path(memory_file).read_text())
            print(f"  worker peak GPU memory: {m['allocated'] / 2**30:.2f} GiB allocated, "
                  f"{m['reserved'] / 2**30:.2f} GiB reserved", flush=True)
        else:
            print(f"  worker peak RSS: {peak_rss_mib(pool._procs[-1].pid):.0f} MiB", flush=True)
    finally:
        pool.close()
        if card is not None and (peak := card.stop()) is not None:
            print(f"  card memory used at its highest: {peak / 2**30:.2f} GiB", flush=True)
        if os.path.exists(memory_file):
            os.unlink(memory_file)
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model_dir", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--max_batch", type=int, default=8)
    ap.add_argument("--cache_mb", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lm_batch", type=int, default=0, help="the worker's --lm_batch (default 0: off)")
    ap.add_argument("--skip_modes", action="store_true", help="only the saved voice at --concurrency")
    args = ap.parse_args()
    dtypes = args.dtypes.split(",")
    if bad := [d for d in dtypes if d not in DTYPES]:
        ap.error(f"--dtypes: unknown {bad} (choose from {', '.join(DTYPES)})")
    levels = [int(c) for c in args.concurrency.split(",") if c]
    ok = True
    for dtype in dtypes:
        ok = run_dtype(args, dtype, levels) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
