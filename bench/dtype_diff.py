"""How far the half dtype (and TF32) move the output from strict float32, on the same inputs.

    python bench/dtype_diff.py [--model_dir DIR | --size tiny|full] [--device cuda] [--dtype bfloat16]
                               [--tokens 150] [--threads 2] [--backend] [--json OUT]

Fixed random inputs (seed 0): a prompt of 50 speech tokens (its mel, embedding) and --tokens target tokens.
Compared with strict float32 (TF32 off): the flow's mel (whole utterance), the streamed audio (incremental
flow with its state, HiFT in float32, crossfades) and the LM's next-token distribution over the target
tokens, teacher-forced (max |p - p_fp32| over all rows and tokens, and how often the argmax agrees).
Variants: float32 with TF32 (CUDA only) and --dtype with TF32. Without --model_dir a random model of
--size is built into .cache/<size>-random (full: about 2.6 GB).
--backend: the vLLM backend too (`launch/backend.py`, one in float32 and one in --dtype), its next-token
distribution against the same strict float32 reference, teacher-forced by prompting it with the prompt and
the target tokens before each step (their speech embeddings: what its decode steps feed), one token each
with its 20 most likely tokens' log-probabilities (max |p - p_fp32| over those, argmax agreement).
--json OUT: the rows and `provenance()`.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from cosy.lm.model import SpeechLM  # noqa: E402
from cosy.model.precision import resolve_dtype, set_tf32  # noqa: E402
from cosy.pipeline.token2wav import FlowPrompt, load_token2wav  # noqa: E402
from cosy.verify.random_model import write_random_model  # noqa: E402


def inputs(n_tokens: int, n_prompt: int = 50):
    g = torch.Generator().manual_seed(0)
    prompt = FlowPrompt(torch.randint(0, 6561, (1, n_prompt), generator=g, dtype=torch.int32),
                        0.5 * torch.randn(1, 2 * n_prompt, 80, generator=g) - 5.0, torch.randn(1, 192, generator=g))
    tokens = torch.randint(0, 6561, (1, n_tokens), generator=g, dtype=torch.int32)
    text = torch.randint(0, 150000, (30,), generator=g)
    return prompt, tokens, text


def outputs(model_dir: Path, device: str, dtype: torch.dtype, n_tokens: int) -> dict[str, torch.Tensor]:
    """mel (1, 80, F), streamed audio (N,), LM probabilities (n_tokens, V): all float32 on the CPU."""
    prompt, tokens, text = inputs(n_tokens)
    t2w = load_token2wav(model_dir, device, dtype, cache_mb=1024)
    t0 = time.perf_counter()
    mel = t2w.mel(tokens, prompt).cpu()
    stream = t2w.stream(prompt, seed=0)
    wav = torch.cat(stream.push(tokens[0].tolist()) + [stream.finish()])
    t1 = time.perf_counter()
    del t2w
    lm = SpeechLM.from_model_dir(model_dir, device=device, dtype=dtype)
    embeds = lm.prompt_embeds(text, (), prompt.tokens[0])
    logp, _ = lm.teacher_forced_logprobs(embeds, tokens[0].tolist())
    t2 = time.perf_counter()
    del lm
    print(f"  {dtype} on {device}: flow+HiFT {t1 - t0:.2f} s, LM {n_tokens} steps {t2 - t1:.2f} s", flush=True)
    return {"mel": mel, "audio": wav, "probs": logp.exp().cpu()}


def backend_probs(model_dir: Path, dtype: str, n_tokens: int, port: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A backend in `dtype`, teacher-forced over the target tokens: (ids (n, 20), probabilities (n, 20)) of
    each step's 20 most likely tokens."""
    import base64
    import io
    import os
    import signal

    import openai
    from lm_throughput import start_backend

    from cosy.lm.export import llm_fingerprint, served_model_name
    from cosy.lm.prompt import PromptEmbedder
    from cosy.model.files import ModelDir

    prompt, tokens, text = inputs(n_tokens)
    embedder = PromptEmbedder.from_model_dir(model_dir)
    head = embedder(text, (), prompt.tokens[0])[0].float()
    body = embedder.speech(tokens[0].tolist())[0].float()
    name = served_model_name(llm_fingerprint(model_dir), ModelDir(model_dir).family)
    proc, url = start_backend(model_dir, port, "diff-key", ("--dtype", dtype))
    ids, probs = [], []
    try:
        client = openai.OpenAI(base_url=url, api_key="diff-key", max_retries=0)
        t0 = time.perf_counter()
        for i in range(n_tokens):
            buf = io.BytesIO()
            torch.save(torch.cat([head, body[:i]]).clone(), buf)
            r = client.completions.create(model=name, prompt=None, max_tokens=1, temperature=0.0, logprobs=20,
                                          extra_body={"prompt_embeds": base64.b64encode(buf.getvalue()).decode(),
                                                      "return_tokens_as_token_ids": True})
            top = r.choices[0].logprobs.top_logprobs[0]
            ids.append([int(t.removeprefix("token_id:")) for t in top])
            probs.append([float(v) for v in top.values()])
        print(f"  backend {dtype}: {n_tokens} teacher-forced steps {time.perf_counter() - t0:.2f} s", flush=True)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    return torch.tensor(ids), torch.tensor(probs).exp()


def compare_backend(ref: dict, ids: torch.Tensor, probs: torch.Tensor) -> tuple[str, dict]:
    dp = (probs - ref["probs"].gather(1, ids)).abs().max()
    agree = (ids[:, 0] == ref["probs"].argmax(-1)).float().mean()
    return (f"LM max|dp| {dp:.4f} (its 20 most likely tokens per step), argmax agrees {100 * agree:.0f} %",
            {"lm_max_dp_top20": float(dp), "lm_argmax_agree": float(agree)})


def compare(ref: dict, out: dict) -> str:
    mel = (out["mel"] - ref["mel"]).abs()
    audio = (out["audio"] - ref["audio"]).abs()
    probs = (out["probs"] - ref["probs"]).abs().max()
    agree = (out["probs"].argmax(-1) == ref["probs"].argmax(-1)).float().mean()
    figures = {"mel_max_d": float(mel.max()), "mel_rms_d": float(mel.pow(2).mean().sqrt()),
               "mel_max": float(ref["mel"].abs().max()), "audio_max_d": float(audio.max()),
               "audio_rms_d": float(audio.pow(2).mean().sqrt()), "audio_max": float(ref["audio"].abs().max()),
               "lm_max_dp": float(probs), "lm_argmax_agree": float(agree)}
    return (f"mel max|d| {mel.max():.4f} (rms {mel.pow(2).mean().sqrt():.4f}, max|mel| {ref['mel'].abs().max():.2f}); "
            f"audio max|d| {audio.max():.4f} (rms {audio.pow(2).mean().sqrt():.5f}, max|audio| "
            f"{ref['audio'].abs().max():.3f}); LM max|dp| {probs:.4f}, argmax agrees {100 * agree:.0f} %"), figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model_dir", type=Path)
    ap.add_argument("--size", choices=("tiny", "full"), default="full")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tokens", type=int, default=150)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--backend", action="store_true", help="the vLLM backend too, in float32 and in --dtype")
    ap.add_argument("--json", type=Path, help="write the rows and their provenance here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    try:
        half = resolve_dtype(args.dtype, args.device)
    except ValueError as e:
        ap.error(str(e))
    model_dir = args.model_dir or ROOT / ".cache" / f"{args.size}-random"
    if not (model_dir / "llm.pt").exists():
        print(f"building the {args.size} random model in {model_dir} ...", flush=True)
        write_random_model(model_dir, args.size, seed=0)
    print(f"model {model_dir}; {args.tokens} target tokens; against strict float32 on {args.device}", flush=True)
    set_tf32(args.device, False)
    ref = outputs(model_dir, args.device, torch.float32, args.tokens)
    rows = []
    if args.device.startswith("cuda"):
        set_tf32(args.device, True)
        rows.append(("float32+TF32", *compare(ref, outputs(model_dir, args.device, torch.float32, args.tokens))))
    set_tf32(args.device, True)
    rows.append((f"{args.dtype}", *compare(ref, outputs(model_dir, args.device, half, args.tokens))))
    if args.backend:
        for i, dt in enumerate(("float32", args.dtype)):
            rows.append((f"backend {dt}", *compare_backend(ref, *backend_probs(model_dir, dt, args.tokens,
                                                                                8126 + i))))
    for name, line, _ in rows:
        print(f"{name:<16} {line}", flush=True)
    if args.json:
        from provenance import provenance
        args.json.write_text(json.dumps({"provenance": provenance(), "bench": "dtype_diff", "model": str(model_dir),
                                         "tokens": args.tokens, "device": args.device,
                                         "rows": {name: figures for name, _, figures in rows}}, indent=1))


if __name__ == "__main__":
    main()
