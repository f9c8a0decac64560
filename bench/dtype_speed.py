"""float32 against bfloat16 per CPU kind: CPU seconds of the embedded LM's decode step and of the flow + HiFT
(a whole utterance, a stream's first chunk), on this CPU as it is and with oneDNN capped below its bfloat16
units to stand in for CPUs without them.

    python bench/dtype_speed.py [--model_dir DIR] [--kinds native,AVX512_CORE_BF16,AVX512_CORE,AVX2]
                                [--tokens 100] [--steps 30] [--repeats 3] [--json OUT]

Each kind runs in a child process of its own (oneDNN reads its ISA cap, ONEDNN_MAX_CPU_ISA, once): native
(this CPU), AVX512_CORE_BF16 (AVX512-BF16 without AMX, e.g. Cooper Lake, AMD Zen 4/5), AVX512_CORE
(AVX-512 without bf16, e.g. Skylake to Cascade Lake), AVX2 (also ATen's kernels capped: e.g. AMD Zen 2/3).
A cap hides units from oneDNN and torch's own AVX-512 kernels still run, so the capped kinds approximate those
CPUs; their clock, caches and memory stay this machine's. One thread; CPU seconds of the measuring process
(on a machine shared with other work they hold where wall time does not); the dtypes alternate (ABBA), each
figure the median of --repeats. Without --model_dir: the full-size random model (bench/models.py).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

KINDS = {"native": {}, "AVX512_CORE_BF16": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},
         "AVX512_CORE": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
         "AVX2": {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}}
DTYPES = ("float32", "bfloat16")


def measure_kind(model_dir: Path, tokens: int, steps: int, repeats: int) -> dict:
    """In the child: {dtype: {figure: median CPU s}} and what the LM ran on."""
    import torch
    from dtype_diff import inputs
    from lm_throughput import prompt as lm_prompt

    from cosy.lm.model import SpeechLM
    from cosy.model.precision import cpu_bf16_units
    from cosy.pipeline.token2wav import load_token2wav

    torch.set_num_threads(1)
    prompt, target, _ = inputs(tokens)
    parts = {}
    for name in DTYPES:
        dtype = getattr(torch, name)
        lm = SpeechLM.from_model_dir(model_dir, dtype=dtype)
        parts[name] = (lm, lm_prompt(lm.prompt_embeds), load_token2wav(model_dir, "cpu", dtype, cache_mb=1024))

    def cpu(fn) -> float:
        t = time.process_time()
        fn()
        return time.process_time() - t

    def decode(lm, embeds) -> float:
        it = lm.generate(embeds, steps + 1, steps + 1, seed=0,
                         params=dataclasses.replace(lm.sampling, ignore_stop=True))
        next(it)  # the prefill
        return cpu(lambda: sum(1 for _ in it)) / steps

    def first_chunk(t2w) -> float:
        stream = t2w.stream(prompt, seed=0)
        n = stream.first_chunk_tokens
        took = cpu(lambda: stream.push(target[0, :n].tolist()))
        stream.close()
        return took

    def whole(t2w) -> float:
        return cpu(lambda: t2w.vocode(t2w.mel(target, prompt), seed=0))

    runs: dict[str, dict[str, list[float]]] = {n: {"lm_step": [], "flow_whole": [], "flow_first_chunk": []}
                                               for n in DTYPES}
    with torch.inference_mode():
        for name in DTYPES:  # warm-up
            lm, embeds, t2w = parts[name]
            decode(lm, embeds), first_chunk(t2w)
        for i in range(repeats):
            for name in DTYPES if i % 2 == 0 else DTYPES[::-1]:
                lm, embeds, t2w = parts[name]
                runs[name]["lm_step"].append(decode(lm, embeds))
                runs[name]["flow_whole"].append(whole(t2w))
                runs[name]["flow_first_chunk"].append(first_chunk(t2w))
    return {"cpu_bf16_units": cpu_bf16_units(), "lm_kernels": parts["bfloat16"][0].kernels,
            "cpu_s": {n: {k: statistics.median(v) for k, v in runs[n].items()} for n in DTYPES}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model_dir", type=Path)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--tokens", type=int, default=100, help="target tokens of the flow's utterance")
    ap.add_argument("--steps", type=int, default=30, help="LM decode steps per measurement")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:  # one kind, in the environment the parent set: JSON on the last line
        print(json.dumps(measure_kind(args.model_dir, args.tokens, args.steps, args.repeats)), flush=True)
        return
    from models import model_dir
    args.family = None
    directory = model_dir(ap, args)
    kinds = args.kinds.split(",")
    for k in kinds:
        if k not in KINDS:
            ap.error(f"--kinds: {k!r} is not one of {', '.join(KINDS)}")
    print(f"model {directory}; LM: {args.steps} decode steps; flow + HiFT: {args.tokens} tokens; 1 thread, CPU s; "
          f"medians of {args.repeats}", flush=True)
    out = {}
    for k in kinds:
        env = {key: v for key, v in os.environ.items() if key not in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")}
        child = subprocess.run([sys.executable, __file__, "--child", "--model_dir", str(directory), "--tokens",
                                str(args.tokens), "--steps", str(args.steps), "--repeats", str(args.repeats)],
                               env={**env, **KINDS[k]}, capture_output=True, text=True)
        if child.returncode:
            raise SystemExit(f"kind {k} failed:\n{child.stderr[-3000:]}")
        out[k] = json.loads(child.stdout.strip().splitlines()[-1])
        c = out[k]["cpu_s"]
        print(f"{k:<17} units {out[k]['cpu_bf16_units']}; LM bf16: {out[k]['lm_kernels']}", flush=True)
        for fig in c["float32"]:
            a, b = c["float32"][fig], c["bfloat16"][fig]
            print(f"  {fig:<17} float32 {a:7.3f} s  bfloat16 {b:7.3f} s  bf16 speed {a / b:5.2f}x", flush=True)
    if args.json:
        from provenance import provenance
        args.json.write_text(json.dumps({"provenance": provenance(), "bench": "dtype_speed", "model": str(directory),
                                         "tokens": args.tokens, "steps": args.steps, "repeats": args.repeats,
                                         "kinds": out}, indent=1))


if __name__ == "__main__":
    main()
