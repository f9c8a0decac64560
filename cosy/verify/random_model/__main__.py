"""python -m cosy.random_model OUT_DIR [--family cosyvoice2|cosyvoice3] --size tiny|full [--seed N]"""
from __future__ import annotations

import argparse
import sys

from cosy.verify.random_model import SIZES, WRITERS, write_random_model


def build_parser() -> argparse.ArgumentParser:
    """The builder's flags (the docs' flags reference is generated from this parser)."""
    parser = argparse.ArgumentParser(prog="python -m cosy.random_model",
                                     description="Write a random-weight model directory (official layout).")
    parser.add_argument("out_dir", help="the directory to write (created; files in it are replaced)")
    parser.add_argument("--family", choices=sorted(WRITERS), default="cosyvoice2", help="the model family's layout")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny",
                        help="full: the published dimensions; tiny: for fast CPU tests")
    parser.add_argument("--seed", type=int, default=0, help="the weights' seed (same seed, same files)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    print(write_random_model(args.out_dir, args.size, args.seed, args.family))
    return 0


if __name__ == "__main__":
    sys.exit(main())
