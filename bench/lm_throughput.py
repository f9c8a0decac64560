"""LM throughput: tokens/s and time to first token at 1, 8 and 16 concurrent requests, embedded LM vs a
vLLM backend (`launch/backend.py`), fixed token counts; float32 against bfloat16 in one run with --dtypes.

    python bench/lm_throughput.py [--model_dir DIR] [--tokens 100] [--concurrency 1,8,16] [--repeats 1] [--lm_batch 8]
                                  [--backend_url URL --api_key KEY | --start_backend [--backend_cpus LIST]
                                   [--backend_nice N]] [--skip_embedded]
                                  [--device cuda --dtype bfloat16 --no_tf32]   (the embedded LM's)
                                  [--dtypes float32,bfloat16] [--json OUT]

Without --model_dir the full-size random model of bench/synthesis.py is used (built if missing).
--start_backend starts `launch/backend.py` on that model for the run (port 8123, then 8124 ...) and stops it
after. --dtypes: each LM in each of these dtypes (an embedded LM, and with --start_backend a backend
`--dtype`, per dtype), all loaded for the whole run; the ratio to the first dtype is printed.
Every LM is measured in turn (the order flips every repeat), each figure the median of --repeats.
--json OUT: the rows, what each dtype's LM ran on, and `provenance()`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from devices import add_device_args, check_device_args, peak_gpu  # noqa: E402

from cosy.lm.export import llm_fingerprint, served_model_name  # noqa: E402
from cosy.lm.model import SpeechLM  # noqa: E402
from cosy.lm.prompt import PromptEmbedder  # noqa: E402
from cosy.model.files import ModelDir  # noqa: E402
from cosy.model.precision import DTYPES, cpu_bf16_units, set_tf32  # noqa: E402
from cosy.verify.random_model import write_random_model  # noqa: E402


def prompt(embedder, n_text: int = 30, n_prompt_text: int = 12, n_speech: int = 87):
    g = torch.Generator().manual_seed(0)
    return embedder(torch.randint(0, 151000, (n_text,), generator=g),
                    torch.randint(0, 151000, (n_prompt_text,), generator=g),
                    torch.randint(0, 6561, (n_speech,), generator=g))


def measure(lm, embeds, n_tokens: int, concurrency: int) -> tuple[float, float, float, float]:
    """(total tokens/s, median TTFT s, p95 TTFT s, decode tokens/s) of `concurrency` simultaneous requests;
    decode tokens/s: the requests' own rates after their first token, summed."""
    params = dataclasses.replace(lm.sampling, ignore_stop=True)
    ttft, counts, ends = [0.0] * concurrency, [0] * concurrency, [0.0] * concurrency
    start = time.perf_counter()

    def work(i: int) -> None:
        t0 = time.perf_counter()
        for _ in lm.generate(embeds, n_tokens, n_tokens, seed=i, params=params):
            if counts[i] == 0:
                ttft[i] = time.perf_counter() - t0
            counts[i] += 1
        ends[i] = time.perf_counter() - t0

    threads = [threading.Thread(target=work, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    assert all(c == n_tokens for c in counts), counts
    q = sorted(ttft)
    decode = sum((c - 1) / max(e - f, 1e-9) for c, e, f in zip(counts, ends, ttft))
    return sum(counts) / wall, statistics.median(q), q[min(len(q) - 1, int(0.95 * len(q)))], decode


def start_backend(model_dir: Path, port: int, key: str, extra: tuple[str, ...] = (),
                  prefix: tuple[str, ...] = (), env: dict[str, str] | None = None,
                  root: Path = ROOT) -> tuple[subprocess.Popen, str]:
    """`launch/backend.py` of the checkout `root` on `port` (`env`: variables added to ours); returns it and
    its URL once ready."""
    proc = subprocess.Popen([*prefix, sys.executable, str(root / "launch" / "backend.py"), "--model_dir",
                             str(model_dir), "--host", "127.0.0.1", "--port", str(port), "--api_key", key, *extra],
                            stdout=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, **(env or {})})
    for line in proc.stdout:
        print("  backend:", line.rstrip(), flush=True)
        if line.startswith("cosy backend ready:"):
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, line.split(": ", 1)[1].strip()
    raise SystemExit(f"backend exited with {proc.wait()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model_dir", type=Path)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--concurrency", default="1,8,16")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backend_url")
    ap.add_argument("--api_key", default=os.environ.get("COSY_LLM_API_KEY", "bench-key"))
    ap.add_argument("--start_backend", action="store_true")
    ap.add_argument("--skip_embedded", action="store_true")
    ap.add_argument("--lm_batch", type=int, default=0,
                    help="also measure the embedded LM decoding up to N requests a step (cosy.lm.decode_batch; "
                         "the app's --lm_batch), as 'batched'")
    ap.add_argument("--backend_cpus", default=None, help="--start_backend: its --cpus (default: vLLM's binding)")
    ap.add_argument("--backend_nice", type=int, default=0, help="--start_backend: its --nice N")
    ap.add_argument("--repeats", type=int, default=1, help="measurements per LM and level (medians printed)")
    ap.add_argument("--dtypes", default=None,
                    help="comma-separated dtypes to compare in one run, each LM in each (default: --dtype)")
    ap.add_argument("--json", type=Path, help="write the results and their provenance here")
    add_device_args(ap)
    args = ap.parse_args()
    check_device_args(ap, args)
    dtypes = (args.dtypes or args.dtype).split(",")
    for dt in dtypes:
        if dt not in DTYPES:
            ap.error(f"--dtypes: {dt!r} is not one of {', '.join(DTYPES)}")
    torch.set_num_threads(args.threads)
    model_dir = args.model_dir or ROOT / ".cache" / "full-random"
    if not (model_dir / "llm.pt").exists():
        write_random_model(model_dir, "full", seed=0)
    levels = [int(c) for c in args.concurrency.split(",")]
    print(f"model {model_dir}; {args.tokens} tokens per request; prompt 131 positions; embedded LM on "
          f"{args.device} ({', '.join(dtypes)}), {args.threads} threads; CPU bf16 units: {cpu_bf16_units()}; "
          f"medians of {args.repeats}, the LMs alternating")
    lms: dict[str, tuple] = {}  # name -> (generate-able LM, its prompt embeddings)
    kernels: dict[str, str] = {}
    if not args.skip_embedded:
        set_tf32(args.device, args.tf32)
        for dt in dtypes:
            lm = SpeechLM.from_model_dir(model_dir, device=args.device, dtype=DTYPES[dt])
            kernels[f"embedded {dt}"] = lm.kernels
            lms[f"embedded {dt}"] = (lm, prompt(lm.prompt_embeds))
            if args.lm_batch > 1:
                from cosy.lm.decode_batch import BatchedLM
                lms[f"batched {dt}"] = (BatchedLM(lm, args.lm_batch), lms[f"embedded {dt}"][1])
    procs = []
    urls = {"": args.backend_url} if args.backend_url else {}
    runs: dict[tuple[str, int], list] = {}
    try:
        if args.start_backend:
            extra = ("--cpus", args.backend_cpus) if args.backend_cpus else ()
            extra += ("--nice", str(args.backend_nice)) if args.backend_nice else ()
            for i, dt in enumerate(dtypes):
                proc, urls[dt] = start_backend(model_dir, 8123 + i, args.api_key, (*extra, "--dtype", dt))
                procs.append(proc)
        if urls:
            from cosy.lm.remote import RemoteLM  # the backend client (openai): only when there is a backend
            family = ModelDir(model_dir).family
            embeds = prompt(PromptEmbedder.from_model_dir(model_dir))
            for dt, url in urls.items():
                remote = RemoteLM(url, args.api_key, served_model_name(llm_fingerprint(model_dir), family),
                                  family=family)
                remote.check()
                lms[f"backend {dt}".strip()] = (remote, embeds)
        for lm, embeds in lms.values():
            measure(lm, embeds, 5, 1)  # warm-up
        # alternated (ABBA), so a machine that drifts during the run weighs on all LMs alike
        for i in range(args.repeats):
            for n in levels:
                for name in (list(lms) if i % 2 == 0 else list(lms)[::-1]):
                    runs.setdefault((name, n), []).append(measure(*lms[name], args.tokens, n))
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
    rows = [(name, n, *(statistics.median(r[k] for r in runs[name, n]) for k in range(4)))
            for name in lms for n in levels]
    by = {(name, n): (tps, dec) for name, n, tps, _, _, dec in rows}
    print(f"{'LM':<18} {'concurrent':>10} {'tokens/s':>10} {'TTFT p50':>9} {'TTFT p95':>9} {'decode/s':>9} "
          f"{'vs ' + dtypes[0] + ' (decode)':>24}")
    out = []
    for name, n, tps, p50, p95, dec in rows:
        kind, _, dt = name.partition(" ")
        base = by.get((f"{kind} {dtypes[0]}", n)) if dt else None
        ratio = (tps / base[0], dec / base[1]) if base else None
        print(f"{name:<18} {n:>10} {tps:>10.1f} {p50:>8.2f}s {p95:>8.2f}s {dec:>9.1f} "
              f"{(f'{ratio[0]:.2f}x ({ratio[1]:.2f}x)' if ratio else ''):>24}")
        out.append({"lm": kind, "dtype": dt or None, "concurrency": n, "tokens_per_s": tps, "ttft_p50": p50,
                    "ttft_p95": p95, "decode_tokens_per_s": dec,
                    f"vs_{dtypes[0]}": ratio[0] if ratio else None,
                    f"decode_vs_{dtypes[0]}": ratio[1] if ratio else None})
    if peak_gpu(args.device) and not args.skip_embedded:
        print(f"embedded LM on {args.device}: {peak_gpu(args.device)}")
    if args.json:
        from provenance import provenance
        args.json.write_text(json.dumps({
            "provenance": provenance(), "bench": "lm_throughput", "tokens": args.tokens, "threads": args.threads,
            "repeats": args.repeats, "cpu_bf16_units": cpu_bf16_units(), "kernels": kernels, "rows": out}, indent=1))


if __name__ == "__main__":
    main()
