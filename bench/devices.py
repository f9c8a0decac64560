"""The bench scripts' device flags (`--device`, `--dtype`, `--no_tf32`, as the frontend's and the CLI's) and
GPU figures: peak memory, and a synchronize so that stage timings on CUDA measure the work, not the launch."""
from __future__ import annotations

import argparse

import torch

from cosy.model.precision import DTYPES, resolve_dtype


def add_device_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    ap.add_argument("--dtype", choices=DTYPES, default="float32",
                    help="the LM's and flow estimator's dtype (README 'Precision'; default float32)")
    ap.add_argument("--no_tf32", dest="tf32", action="store_false", help="strict float32 on CUDA")


def check_device_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    try:
        resolve_dtype(args.dtype, args.device)
    except (ValueError, RuntimeError) as e:
        ap.error(str(e))
    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            ap.error(f"--device {args.device}: no CUDA device here")
        torch.cuda.reset_peak_memory_stats(args.device)


def sync(device: str | torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def peak_gpu(device: str | torch.device) -> str:
    """'peak GPU memory: X GiB allocated (Y GiB reserved)', or '' off CUDA."""
    if torch.device(device).type != "cuda":
        return ""
    return (f"peak GPU memory: {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB allocated "
            f"({torch.cuda.max_memory_reserved(device) / 2**30:.2f} GiB reserved)")
