"""What batching flows across requests buys on this device, and why audio cannot match solo runs exactly.

    python bench/flow_batch.py [--model_dir DIR | --family cosyvoice2|cosyvoice3] [--rows 1,2,4,8]
                               [--tokens 100] [--threads 2] [--device cuda --dtype bfloat16]

1. Cost: whole-utterance flows of `rows` requests (the same --tokens, a 50-token prompt) run as one padded
   batch (`FlowModel.inference_batch`, the CFG pair doubles it) against the same rows run solo: seconds
   per row and the speed-up; likewise a streaming chunk (50 new tokens after a saved voice's 50-token
   prompt state, `incremental.sample_new_rows`) and CosyVoice2's HiFT step of a 108-frame chunk
   (`HiFTGenerator.inference_rows`). This decides `--flow_batch`'s default per device.
2. Equality: the largest mel difference between a batched row and its solo run (kernels pick other blockings
   for other batch shapes, so the rounding differs; the bound is 1e-5).
3. HiFT's sensitivity: the audio difference caused by perturbing a mel by 1e-7 (about one float32 ulp at the
   mel's magnitude) and 1e-6, for 2 to 24 s of audio. HiFT's sine source integrates f0 into a phase over the
   whole utterance, so any rounding difference in the mel grows with the length: a computation that is not
   bit-identical to the solo run cannot promise 1e-4 on long audio, batched or not.
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

from cosy.model.load import load_flow, load_hift  # noqa: E402
from cosy.model.precision import DTYPES  # noqa: E402


def rows_of(n: int, tokens: int, g: torch.Generator) -> list[tuple]:
    out = []
    for _ in range(n):
        prompt = torch.randint(0, 6561, (1, 50), generator=g)
        out.append((torch.randint(0, 6561, (1, tokens), generator=g), prompt,
                    0.5 * torch.randn(1, 100, 80, generator=g) - 5.0, torch.randn(1, 192, generator=g)))
    return out


def timed(fn, device: str) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(ap)
    ap.add_argument("--rows", default="1,2,4,8")
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    add_device_args(ap)
    args = ap.parse_args()
    check_device_args(ap, args)
    torch.set_num_threads(args.threads)
    md = bench_model_dir(ap, args)
    dev = args.device
    flow = load_flow(md, dev, DTYPES[args.dtype])
    g = torch.Generator().manual_seed(0)
    to_dev = lambda r: tuple(x.to(dev) for x in r)  # noqa: E731
    print(f"model {md}; {args.tokens} tokens per row after a 50-token prompt; {dev} ({args.dtype}), "
          f"{args.threads} threads", flush=True)
    timed(lambda: flow.inference(*to_dev(rows_of(1, args.tokens, g)[0]), streaming=False, finalize=True), dev)
    print(f"{'rows':>4} {'solo s/row':>10} {'batch s/row':>11} {'speed-up':>8} {'mel max diff':>12}")
    for n in (int(x) for x in args.rows.split(",")):
        rows = [to_dev(r) for r in rows_of(n, args.tokens, g)]
        solo_s, solo = timed(lambda: [flow.inference(*r, streaming=False, finalize=True) for r in rows], dev)
        batch_s, batch = timed(lambda: flow.inference_batch(rows), dev)
        diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(batch, solo))
        print(f"{n:>4} {solo_s / n:>10.3f} {batch_s / n:>11.3f} {solo_s / batch_s:>7.2f}x {diff:>12.2e}",
              flush=True)

    from cosy.flow import incremental
    print("streaming chunk: 100 new frames after 100 frames of prompt state")
    for n in (int(x) for x in args.rows.split(",")):
        rows = [to_dev(r) for r in rows_of(n, 50, g)]
        conds = [flow.conditions(*r, streaming=True, finalize=False) for r in rows]
        _, base_state = incremental.sample_new(flow, *conds[0], None, stop=100)
        solo_s, solo = timed(lambda: [incremental.sample_new(flow, *c, base_state) for c in conds], dev)
        batch_s, batch = timed(lambda: incremental.sample_new_rows(flow, [(*c, base_state) for c in conds]), dev)
        diff = max((a[0] - b[0]).abs().max().item() for a, b in zip(batch, solo))
        print(f"{n:>4} {solo_s / n:>10.3f} {batch_s / n:>11.3f} {solo_s / batch_s:>7.2f}x {diff:>12.2e}",
              flush=True)

    hift = load_hift(md, dev)
    with torch.inference_mode():  # warm-up
        hift.inference((0.5 * torch.randn(1, 80, 108, generator=g) - 5).to(dev))
    print("HiFT step of a 108-frame chunk (audio max diff)")
    for n in (int(x) for x in args.rows.split(",")):
        mels = [(0.5 * torch.randn(1, 80, 108, generator=g) - 5).to(dev) for _ in range(n)]
        gens = lambda: [torch.Generator(device=dev).manual_seed(i) for i in range(n)]  # noqa: E731
        with torch.inference_mode():
            solo_s, solo = timed(lambda: [hift.inference(m, generator=gg)[0] for m, gg in zip(mels, gens())], dev)
            batch_s, (batch, _) = timed(lambda: hift.inference_rows(torch.cat(mels), [None] * n, gens()), dev)
        diff = max((batch[i:i + 1] - solo[i]).abs().max().item() for i in range(n))
        print(f"{n:>4} {solo_s / n:>10.3f} {batch_s / n:>11.3f} {solo_s / batch_s:>7.2f}x {diff:>12.2e}",
              flush=True)

    base = flow.inference(*to_dev(rows_of(1, 150, g)[0]), streaming=False, finalize=True).float()
    print("HiFT: audio max-abs difference after perturbing the mel (uniform noise of the given size)")
    for secs in (2, 6, 12, 24):
        mel = base.repeat(1, 1, 1 + secs * 50 // base.size(2))[:, :, :secs * 50]
        with torch.inference_mode():
            ref = hift.inference(mel, generator=torch.Generator(device=dev).manual_seed(0))[0]
            cells = []
            for eps in (1e-7, 1e-6):
                noise = ((torch.rand(mel.shape, generator=g) * 2 - 1) * eps).to(dev)
                out = hift.inference(mel + noise, generator=torch.Generator(device=dev).manual_seed(0))[0]
                cells.append(f"mel +-{eps:.0e}: {(out - ref).abs().max().item():.2e}")
        print(f"  {secs:>2} s of audio: " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
