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

`--dtype auto` (never the default: float32 stays the exact reference) picks per role (the embedded LM, the
flow estimator, the vLLM backend) what is faster there: bfloat16 where the hardware has bfloat16 matrix
units (a CUDA GPU of compute capability 8.0 or later; a CPU with AMX-BF16 or AVX512-BF16, `cpu_bf16_units`)
and the role gains from them (`AUTO_CPU_ROLES`), float32 elsewhere. On the CPU the embedded LM's bfloat16
linear layers use oneDNN's prepacked weights only where the units are (`cosy.lm.qwen2.pack_linears`).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CPU_DTYPES = ("float32", "bfloat16")
AUTO = "auto"
DTYPE_CHOICES = (*DTYPES, AUTO)  # what the --dtype flags accept
ROLES = ("lm", "flow", "backend")  # the embedded LM, the flow estimator, the vLLM backend's LM
ROLE_NAMES = {"lm": "LM", "flow": "flow", "backend": "backend"}
# the CPU units on which each role measured faster in bfloat16 than in float32 (bench/dtype_speed.py,
# docs/deployment/precision.md): `auto` picks bfloat16 for a role only on these. The LM's decode step reads
# weights (half the bytes pay wherever bf16 dot products are native); the flow's convolutions and attention
# are arithmetic, which AVX512-BF16 alone does slower in bf16 than AVX-512 does in float32. The backend was
# measured with AMX only (vLLM's CPU kernels choose AMX from the CPU's flags, so a oneDNN cap cannot stand
# in for a CPU without it)
AUTO_CPU_ROLES: dict[str, tuple[str, ...]] = {
    "lm": ("AMX-BF16", "AVX512-BF16"),
    "flow": ("AMX-BF16",),
    "backend": ("AMX-BF16",),
}
# oneDNN's ISA cap (ONEDNN_MAX_CPU_ISA, its documented names), lowest first: a cap below a unit hides it
# from oneDNN, so it hides it here too (and lets a benchmark stand in for a CPU without the unit)
_ISA_ORDER = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
              "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512", "AVX512_CORE_AMX", "AVX10_1_512_AMX",
              "AVX512_CORE_AMX_FP16", "AVX10_1_512_AMX_FP16")
_UNIT_ISA = {"AMX-BF16": "AVX512_CORE_AMX", "AVX512-BF16": "AVX512_CORE_BF16"}
_UNIT_FLAG = {"AMX-BF16": "amx_bf16", "AVX512-BF16": "avx512_bf16"}


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()  # not Linux on x86: no unit is claimed, so `auto` stays float32


def cpu_bf16_units(flags: set[str] | None = None, isa_cap: str | None = None) -> str | None:
    """The CPU's best bfloat16 matrix unit that oneDNN may use: "AMX-BF16", "AVX512-BF16", or None.

    `flags`: the CPU's feature flags (default: /proc/cpuinfo's); `isa_cap`: oneDNN's ISA cap (default:
    $ONEDNN_MAX_CPU_ISA or $DNNL_MAX_CPU_ISA; ALL, DEFAULT or unset cap nothing)."""
    flags = _cpu_flags() if flags is None else flags
    cap = (isa_cap if isa_cap is not None else
           os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").upper()
    for unit in ("AMX-BF16", "AVX512-BF16"):
        if _UNIT_FLAG[unit] in flags and (cap not in _ISA_ORDER or
                                          _ISA_ORDER.index(cap) >= _ISA_ORDER.index(_UNIT_ISA[unit])):
            return unit
    return None


def auto_dtype(device: str | torch.device, role: str) -> tuple[str, str]:
    """What `--dtype auto` means for `role` (one of ROLES) on `device`: (dtype name, why, for the log)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    dev = torch.device(device)
    if dev.type == "cuda":
        if torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False):
            return "bfloat16", "the GPU has bfloat16 tensor cores"
        return "float32", "the GPU has no bfloat16 tensor cores"
    if dev.type != "cpu":
        return "float32", f"no bfloat16 rule for {dev.type}"
    unit = cpu_bf16_units()
    if unit is None:
        return "float32", "the CPU has no bfloat16 matrix unit, neither AMX-BF16 nor AVX512-BF16"
    if unit in AUTO_CPU_ROLES[role]:
        return "bfloat16", f"the CPU has {unit}"
    return "float32", f"the CPU has {unit}, which the {ROLE_NAMES[role]} does not gain from"


def dtype_name(name: str, device: str | torch.device, role: str) -> str:
    """The dtype name `--dtype name` stands for in `role` on `device` (`auto` resolved, others as given)."""
    return auto_dtype(device, role)[0] if name == AUTO else name


def describe(name: str, device: str | torch.device, roles: tuple[str, ...] = ("lm", "flow")) -> str:
    """For the start-up log: what `--dtype name` chose for each of `roles` on `device` (why, for `auto`), and
    on the CPU how a bfloat16 LM runs its linear layers (`cosy.lm.qwen2.pack_linears`)."""
    picks = [(r, dtype_name(name, device, r)) for r in roles]
    text = ", ".join(f"{ROLE_NAMES[r]} {d}" for r, d in picks)
    if name == AUTO:
        text = f"auto: {text} ({'; '.join(sorted({auto_dtype(device, r)[1] for r in roles}))})"
    if torch.device(device).type == "cpu" and ("lm", "bfloat16") in picks:
        unit = cpu_bf16_units()
        text += (f"; the LM's linear layers on oneDNN-prepacked weights ({unit})" if unit else
                 "; the LM's bfloat16 weights as they are (no bfloat16 unit to pack them for)")
    return text


def backend_dtype(name: str | None, gpu: bool) -> tuple[str, str]:
    """The vLLM `--dtype` of `launch/backend.py --dtype name`, and why: None is bfloat16 on a GPU, float32 on
    the CPU; `auto` is `auto_dtype`'s for the backend role (vLLM's own `auto`, the checkpoint's dtype, is not
    offered); any other name goes to vLLM as it is."""
    if name is None:
        return ("bfloat16", "the GPU default") if gpu else ("float32", "the CPU default")
    if name == AUTO:
        return auto_dtype("cuda" if gpu else "cpu", "backend")
    return name, "as asked"


def resolve_dtype(name: str, device: str | torch.device, role: str = "lm") -> torch.dtype:
    """The torch dtype `--dtype name` means on `device` (for `role`, where name is `auto`); ValueError (a
    message for the user) if not allowed."""
    if name not in DTYPE_CHOICES:
        raise ValueError(f"--dtype must be one of {', '.join(DTYPE_CHOICES)}, not {name!r}")
    name = dtype_name(name, device, role)
    if torch.device(device).type == "cpu" and name not in CPU_DTYPES:
        raise ValueError(f"--dtype {name} needs a CUDA device (on the CPU: {' or '.join(CPU_DTYPES)})")
    return DTYPES[name]


def set_tf32(device: str | torch.device, enabled: bool) -> None:
    """Process-wide: TF32 for CUDA float32 matmuls and cuDNN convolutions on or off (nothing on the CPU)."""
    if torch.device(device).type != "cuda":
        return
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
