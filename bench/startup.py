"""What a process that builds an engine costs to start (a speech worker, a CLI run), in CPU seconds, for this
checkout and optionally another one, alternating in one run (the machine's speed drifts):

    python bench/startup.py [--baseline /path/to/other/checkout] [--model_dir DIR] [--repeats 3]

Two commands per checkout, each in a fresh interpreter with that checkout first on sys.path: `build` (import
and `Engine.from_model_dir`, what a worker does before it reports ready) and `cli` (a seeded streamed zero-shot
`python -m cosy` run of a short text). CPU = user + system of the child, from getrusage; medians printed.
Without --model_dir a tiny random model is built in a temp dir.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "assets"
PROMPT_TEXT = "希望你以后能够做的比我还好呦。"


def commands(model: Path, out: Path) -> dict[str, list[str]]:
    build = f"from cosy.pipeline.engine import Engine; Engine.from_model_dir({str(model)!r})"
    cli = ["-m", "cosy", "--model_dir", str(model), "--mode", "zero_shot", "--text", "Hello 123, 你好。",
           "--prompt_text", PROMPT_TEXT, "--prompt_wav", str(ASSETS / "zero_shot_prompt.wav"), "--stream",
           "--seed", "1", "--out", str(out)]
    return {"build": ["-c", build], "cli": cli}


def cpu_of(args: list[str], checkout: Path) -> float:
    """CPU seconds of `python args` run with `checkout` first on the path."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, *args], cwd=checkout, env=env, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", type=Path, help="another checkout to compare with (e.g. a git worktree)")
    ap.add_argument("--model_dir", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model_dir
        if model is None:
            from cosy.verify.random_model import write_random_model
            model = write_random_model(Path(tmp) / "model", "tiny", seed=1)
        checkouts = {"this": ROOT, **({"baseline": args.baseline.resolve()} if args.baseline else {})}
        cmds = commands(model, Path(tmp) / "out.wav")
        seconds: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.repeats):
            for what, cmd in cmds.items():
                for name, checkout in checkouts.items():  # alternating: drift hits both alike
                    seconds.setdefault((name, what), []).append(cpu_of(cmd, checkout))
    print(f"model {model}; CPU seconds (user + system), medians of {args.repeats}, alternating")
    print(f"{'command':<8} " + " ".join(f"{name:>10}" for name in checkouts) + ("   ratio" if args.baseline else ""))
    for what in cmds:
        row = [statistics.median(seconds[(name, what)]) for name in checkouts]
        ratio = f"  {row[0] / row[1]:.2f}x" if args.baseline else ""
        print(f"{what:<8} " + " ".join(f"{s:10.2f}" for s in row) + ratio)


if __name__ == "__main__":
    main()
