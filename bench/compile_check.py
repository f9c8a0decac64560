"""`--compile` against eager on this device, same run: compile time, speed and numeric difference.

    python bench/compile_check.py [--model_dir DIR | --family cosyvoice2|cosyvoice3] [--tokens 100]
                                  [--threads 2] [--device cuda --dtype bfloat16] [--parts flow,lm]

flow: a whole-utterance mel and a streamed utterance (incremental chunks) of --tokens tokens after a
50-token prompt, eager vs compiled (`cosy.pipeline.compiled`): seconds (best of 2, after warm-up) and the
max mel difference. lm: --tokens teacher-forced decode steps of the embedded LM, tokens/s and the max
log-probability difference.
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

from devices import add_device_args, check_device_args, sync  # noqa: E402
from models import add_model_args  # noqa: E402
from models import model_dir as bench_model_dir  # noqa: E402

from cosy.model.family import import_object  # noqa: E402
from cosy.model.files import ModelDir  # noqa: E402
from cosy.model.precision import DTYPES  # noqa: E402
from cosy.pipeline import compiled  # noqa: E402
from cosy.pipeline.token2wav import FlowPrompt, load_token2wav  # noqa: E402


def best_of(fn, device: str, n: int = 2) -> tuple[float, object]:
    times, out = [], None
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return min(times), out


def flow_part(md, args) -> None:
    g = torch.Generator().manual_seed(0)
    prompt = FlowPrompt(torch.randint(0, 6561, (1, 50), generator=g, dtype=torch.int32),
                        0.5 * torch.randn(1, 100, 80, generator=g) - 5, torch.randn(1, 192, generator=g))
    tokens = torch.randint(0, 6561, (1, args.tokens), generator=g, dtype=torch.int32)

    def streamed(t2w):
        s = t2w.stream(prompt, seed=0)
        mels = s.push_mels(tokens[0].tolist())
        s.close()
        return torch.cat(mels, dim=2)

    out = {}
    for label in ("eager", "compiled"):
        t2w = load_token2wav(md, args.device, DTYPES[args.dtype], cache_mb=4096)
        t0 = time.perf_counter()
        if label == "compiled":
            compiled.compile_flow(t2w.flow)
        compiled.warm_up(t2w)  # eager: the same warm-up, so both start warm
        setup = time.perf_counter() - t0
        whole_s, whole = best_of(lambda: t2w.mel(tokens, prompt), args.device)
        stream_s, stream = best_of(lambda: streamed(t2w), args.device)
        out[label] = (whole.float().cpu(), stream.float().cpu())
        print(f"flow {label:<8} warm-up {setup:6.1f} s  whole {whole_s:6.2f} s  streamed chunks {stream_s:6.2f} s",
              flush=True)
    (we, se), (wc, sc) = out["eager"], out["compiled"]
    print(f"flow compiled vs eager: whole mel max diff {(we - wc).abs().max().item():.2e}, "
          f"streamed mel max diff {(se - sc).abs().max().item():.2e}", flush=True)


def lm_part(md, args) -> None:
    cls = import_object(ModelDir(md).family.lm)
    cont = torch.randint(0, 6561, (args.tokens,), generator=torch.Generator().manual_seed(1)).tolist()
    out = {}
    for label in ("eager", "compiled"):
        lm = cls.from_model_dir(md, device=args.device, dtype=DTYPES[args.dtype])
        embeds = lm.prompt_embeds(list(range(100, 130)), [], cont[:20])
        t0 = time.perf_counter()
        if label == "compiled":
            compiled.compile_lm(lm)
        lm.teacher_forced_logprobs(embeds, cont[:3])
        setup = time.perf_counter() - t0
        secs, (logp, _) = best_of(lambda: lm.teacher_forced_logprobs(embeds, cont), args.device)
        out[label] = logp.float().cpu()
        print(f"lm   {label:<8} warm-up {setup:6.1f} s  {args.tokens} decode steps {secs:6.2f} s "
              f"({args.tokens / secs:.1f} tokens/s)", flush=True)
    print(f"lm   compiled vs eager: log-prob max diff {(out['eager'] - out['compiled']).abs().max().item():.2e}",
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(ap)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parts", default="flow,lm")
    add_device_args(ap)
    args = ap.parse_args()
    check_device_args(ap, args)
    torch.set_num_threads(args.threads)
    md = bench_model_dir(ap, args)
    print(f"model {md}; {args.device} ({args.dtype}), {args.threads} threads", flush=True)
    parts = args.parts.split(",")
    if "flow" in parts:
        flow_part(md, args)
    if "lm" in parts:
        lm_part(md, args)


if __name__ == "__main__":
    main()
