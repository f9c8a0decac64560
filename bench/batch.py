"""Bulk synthesis throughput: `python -m cosy batch` against a loop of single CLI calls, same run, one backend.

    python bench/batch.py [--model_dir DIR | --family cosyvoice2|cosyvoice3] [--lines 8] [--workers 1,2]
        [--max_batch 8] [--text 今天天气很好。] [--nice 5] [--keep DIR]

Starts one vLLM backend (launch/backend.py) on the model (the full-size random one of --family by default),
saves one voice, writes a manifest of --lines lines (that voice, seeds 0..n-1, --text: a random LM seldom
stops, so it runs to 20 speech tokens per text token, about 100 for the default), then, against that backend:
the loop (`python -m cosy --mode voice ...` once per line, each process loading the model) and the batch
command at each --workers (a frontend's worth of workers each). Prints wall time, audio seconds and audio
seconds per wall second of each, and checks that the same seeds gave the same audio (the same lengths,
samples within 1e-3: batched rows differ from solo ones at float rounding). Both count their own
start-up, as a user running them would.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import soundfile as sf

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from lm_throughput import start_backend  # noqa: E402
from models import add_model_args, model_dir  # noqa: E402
from voice_prompt import PROMPT_TEXT, PROMPT_WAV  # noqa: E402

KEY = "bench-key"


def cosy(*args: object) -> None:
    r = subprocess.run([sys.executable, "-m", "cosy", *map(str, args)], cwd=ROOT, capture_output=True, text=True)
    if r.returncode:
        head = " ".join(map(str, args[:3]))
        raise SystemExit(f"python -m cosy {head} ... exited {r.returncode}:\n{r.stderr[-3000:]}")


def audio_seconds(folder: Path) -> float:
    return sum(sf.info(str(p)).duration for p in folder.glob("*.wav"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_args(ap)
    ap.add_argument("--lines", type=int, default=8)
    ap.add_argument("--workers", default="1,2", help="batch runs: workers per run (a frontend's worth each)")
    ap.add_argument("--max_batch", type=int, default=8)
    ap.add_argument("--text", default="今天天气很好。")
    ap.add_argument("--nice", type=int, default=5, help="the backend's --nice (README 'One machine')")
    ap.add_argument("--keep", type=Path, help="keep the outputs here (default: a temp dir, removed)")
    args = ap.parse_args()
    md = model_dir(ap, args)
    work = args.keep or Path(tempfile.mkdtemp(prefix="cosy-bench-batch-"))
    work.mkdir(parents=True, exist_ok=True)
    backend, url = start_backend(md, 8131, KEY, ("--nice", str(args.nice)))
    remote = ("--llm_base_url", url, "--llm_api_key", KEY)
    patient = ("--llm_stall_timeout", "120")  # the frontend's flag (the single CLI has none): a full batch waits
    try:
        data = work / "data"
        cosy("--model_dir", md, "--data_dir", data, "--mode", "zero_shot", "--text", "你好。", "--prompt_text",
             PROMPT_TEXT, "--prompt_wav", PROMPT_WAV, "--save_voice", "bench", *remote, "--out", work / "voice.wav")
        text = args.text
        lines = [{"id": f"l{k:03d}", "text": text, "voice_id": "bench", "seed": k} for k in range(args.lines)]
        manifest = work / "lines.jsonl"
        manifest.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
        print(f"model {md}; {args.lines} lines of {text!r}; backend {url} (nice {args.nice})", flush=True)
        rows = []

        loop = work / "loop"
        loop.mkdir()
        start = time.monotonic()
        for x in lines:
            cosy("--model_dir", md, "--data_dir", data, "--mode", "voice", "--voice_id", "bench", "--text",
                 x["text"], "--seed", x["seed"], *remote, "--out", loop / f"{x['id']}.wav")
        rows.append(("loop of single CLI calls", time.monotonic() - start, audio_seconds(loop), loop))

        for w in (int(v) for v in args.workers.split(",")):
            out = work / f"batch-w{w}"
            start = time.monotonic()
            cosy("batch", manifest, "--out", out, "--model_dir", md, "--data_dir", data, "--workers", w,
                 "--max_batch", args.max_batch, "--progress", "log", *remote, *patient)
            rows.append((f"batch, --workers {w}", time.monotonic() - start, audio_seconds(out), out))

        print(f"\n{'run':<28} {'wall s':>8} {'audio s':>8} {'audio s / wall s':>17} {'vs loop':>8}")
        for name, wall, audio, _ in rows:
            print(f"{name:<28} {wall:>8.1f} {audio:>8.1f} {audio / wall:>17.3f} "
                  f"{(audio / wall) / (rows[0][2] / rows[0][1]):>7.2f}x")
        # batched rows equal their solo runs at float rounding, which HiFT's phase integral grows with the
        # length (README "Batching and exactness"): the same length (the same speech tokens) and close samples
        ok = True
        for name, _, _, folder in rows[1:]:
            lengths, worst = 0, 0.0
            for x in lines:
                a, b = sf.read(loop / f"{x['id']}.wav")[0], sf.read(folder / f"{x['id']}.wav")[0]
                lengths += a.shape == b.shape
                worst = max(worst, float(np.abs(a - b).max())) if a.shape == b.shape else worst
            print(f"{name}: the loop's length in {lengths} of {len(lines)} files, max abs difference {worst:.2e}")
            ok &= lengths == len(lines) and worst <= 1e-3
        return 0 if ok else 1
    finally:
        os.killpg(backend.pid, signal.SIGTERM)
        backend.wait(60)
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
