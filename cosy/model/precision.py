"""Numeric precision of a synthesis process: the `--dtype` rule and TF32. One definition for the frontends,
the CLI and the bench scripts.

`--dtype` is the dtype of the two heavy parts, the LM and the flow's velocity estimator (the U-Net run
2 x n_timesteps times per chunk). Everything whose error would accumulate stays float32 whatever the dtype:
the ODE state x and the time steps of the flow sampler (and the time embedding, computed from fp32 t), the
flow's encoder (it runs once per chunk), the LM's logits and the RAS sampling, and HiFT (its sine source
integrates f0 into a phase over the whole chunk). float16 is CUDA only (the CPU has no fast fp16 kernels);
bfloat16 also runs on the CPU, where it mostly serves to check the half path on machines without a GPU.

TF32 (CUDA only, Ampere and later): float32 matrix products and convolutions with 10-bit-mantissa inputs
and fp32 accumulation. PyTorch already uses TF32 for cuDNN convolutions by default, so a CUDA fp32 run was
never strict IEEE fp32 in the flow's and HiFT's convolutions; turning it on for matmuls too puts the LM's and
the flow transformers' linear layers on the tensor cores at the same relative error (~5e-4 per product,
far below bfloat16's ~4e-3). `tf32=False` turns both off (strict fp32, the reference for comparisons).
"""
from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CPU_DTYPES = ("float32", "bfloat16")


def resolve_dtype(name: str, device: str | torch.device) -> torch.dtype:
    """The torch dtype `--dtype name` means on `device`; ValueError (a message for the user) if not allowed."""
    if name not in DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, not {name!r}")
    if torch.device(device).type == "cpu" and name not in CPU_DTYPES:
        raise ValueError(f"--dtype {name} needs a CUDA device (on the CPU: {' or '.join(CPU_DTYPES)})")
    return DTYPES[name]


def set_tf32(device: str | torch.device, enabled: bool) -> None:
    """Process-wide: TF32 for CUDA float32 matmuls and cuDNN convolutions on or off (nothing on the CPU)."""
    if torch.device(device).type != "cuda":
        return
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
