"""Per-step cost of the vLLM RAS logits processor: the batch-wide `CosyLogitsProcessor.apply` against the
former row-by-row loop (`apply_rows`), default RAS parameters, a window of 10 past tokens per request.

    python bench/ras_step.py [--device cpu|cuda] [--batches 1,16,64] [--steps 30] [--threads 2]

Needs vLLM importable (the processor's base class); the math itself is `cosy.lm.ras_batch`.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cosy.vllm_plugin import hide_torch_addons  # noqa: E402

hide_torch_addons()
from vllm import SamplingParams as VllmParams  # noqa: E402
from vllm.v1.sample.logits_processor import BatchUpdate  # noqa: E402

from cosy.model.families.cosyvoice2 import FAMILY  # noqa: E402
from cosy.vllm_plugin.ras import CosyLogitsProcessor  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_ms(batch: int, steps: int, device: torch.device, rows: bool) -> float:
    config = SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace(cosy_family=FAMILY.name)))
    proc = CosyLogitsProcessor(config, device, device.type == "cuda")
    gen = torch.Generator().manual_seed(batch)
    logits = (torch.randn(batch, FAMILY.tokens.vocab, generator=gen) * 3).to(device)
    outs = [torch.randint(0, 200, (12,), generator=gen).tolist() for _ in range(batch)]
    args = {"cosy_ras": 1, "cosy_min_len": 5}
    proc.update_state(BatchUpdate(batch, [], [(i, VllmParams(extra_args=args), None, outs[i])
                                              for i in range(batch)], []))
    apply = proc.apply_rows if rows else proc.apply
    times = []
    for s in range(steps + 3):
        x = logits.clone()
        _sync(device)
        t = time.perf_counter()
        apply(x)
        _sync(device)
        if s >= 3:  # warm-up
            times.append(time.perf_counter() - t)
        for o in outs:
            o.append(s % 200)
        proc.update_state(None)
    return 1000 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)  # 1 is faster on a loaded machine
    device = torch.device(a.device)
    print(f"RAS logits processor, one decode step, device {device}, {a.threads} threads (median of {a.steps})")
    print(f"{'batch':>5} {'row by row ms':>14} {'batch-wide ms':>14} {'speed-up':>9}")
    for b in (int(x) for x in a.batches.split(",")):
        old, new = step_ms(b, a.steps, device, True), step_ms(b, a.steps, device, False)
        print(f"{b:>5} {old:>14.2f} {new:>14.2f} {old / new:>8.1f}x")


if __name__ == "__main__":
    main()
