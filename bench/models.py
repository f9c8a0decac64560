"""The model directory a benchmark runs on: --model_dir, or the full-size random model of --family built once
by our builder (`python -m cosy.random_model`) into .cache/full-random (CosyVoice2) or .cache/full-random-cv3."""
from __future__ import annotations

import argparse
from pathlib import Path

from cosy.model.files import ModelDir

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIRS = {"cosyvoice2": ROOT / ".cache" / "full-random", "cosyvoice3": ROOT / ".cache" / "full-random-cv3"}


def add_model_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model_dir", type=Path, help="a model directory (default: the --family random model)")
    ap.add_argument("--family", choices=tuple(DEFAULT_DIRS),
                    help="without --model_dir: which full-size random model (built once, 2-3 GB; default "
                         "cosyvoice2); with it: the family it must be")


def model_dir(ap: argparse.ArgumentParser, args: argparse.Namespace) -> Path:
    """--model_dir (of --family if that is given too), or the --family random model, built if missing."""
    if args.model_dir is not None:
        family = ModelDir(args.model_dir).family.name
        if args.family not in (None, family):
            ap.error(f"--model_dir {args.model_dir} is {family}, not --family {args.family}")
        return args.model_dir
    family = args.family or "cosyvoice2"
    out = DEFAULT_DIRS[family]
    if not (out / "llm.pt").exists():
        from cosy.verify.random_model import write_random_model
        print(f"building the full-size random {family} model in {out} ...", flush=True)
        write_random_model(out, "full", seed=0, family=family)
    return out
