"""python -m cosy.random_model OUT_DIR [--family cosyvoice2|cosyvoice3] --size tiny|full [--seed N]"""
from __future__ import annotations

import argparse
import sys

from cosy.verify.random_model import SIZES, WRITERS, write_random_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cosy.random_model",
                                     description="Write a random-weight model directory (official layout).")
    parser.add_argument("out_dir")
    parser.add_argument("--family", choices=sorted(WRITERS), default="cosyvoice2")
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(write_random_model(args.out_dir, args.size, args.seed, args.family))
    return 0


if __name__ == "__main__":
    sys.exit(main())
