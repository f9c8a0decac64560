"""python -m cosy.random_model OUT_DIR --size tiny|full [--seed N]"""
import argparse

from cosy.random_model import SIZES, write_random_model

parser = argparse.ArgumentParser(prog="python -m cosy.random_model",
                                 description="Write a random-weight CosyVoice2 model directory (official layout).")
parser.add_argument("out_dir")
parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
print(write_random_model(args.out_dir, args.size, args.seed))
