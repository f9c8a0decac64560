"""What the backend's vLLM holds on a GPU, sized up front so that it starts beside frontends on the same card.

vLLM's worker checks at start-up that the GPU's free memory covers `--gpu-memory-utilization` x its total,
even when `--kv-cache-memory-bytes` fixes the KV cache (vllm.v1.worker.utils.request_memory, 0.32 and 0.33):
with its 0.92 default a backend started, or restarted, beside frontends that hold more than 8 % of the card
refuses to start. So with a fixed KV cache the backend also passes the share it really needs: the weights
in the serving dtype, that cache and a headroom for the CUDA context, the profile run's activations and
CUDA graphs. The card's total comes from NVML (nvidia-ml-py, a dependency of CUDA vLLM), which creates no
CUDA context in the launcher.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

HEADROOM = 2 * 2**30  # CUDA context (~0.5 GiB), profile-run activations, CUDA graphs, allocator slack
VLLM_DEFAULT = 0.92  # vLLM's own gpu_memory_utilization: never ask for more than it would take
BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def kv_cache_bytes(export_dir: Path, dtype: str, max_num_seqs: int, max_model_len: int) -> int:
    """KV cache bytes for max_num_seqs full-length sequences of the exported LM (its config.json), +10 %."""
    cfg = json.loads((Path(export_dir) / "config.json").read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    per_token = 2 * cfg["num_hidden_layers"] * kv_heads * head_dim * BYTES.get(dtype, 2)
    return int(1.1 * per_token * max_num_seqs * max_model_len)


def weight_bytes(weights: Path, dtype: str) -> int:
    """The exported weights' size once loaded in `dtype`: their element count (the safetensors header, no
    tensor read) x its width."""
    from safetensors import safe_open

    with safe_open(str(weights), framework="np") as f:
        count = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
    return count * BYTES.get(dtype, 2)


def memory_share(need: int, total: int) -> float:
    """`need` bytes as a share of a `total`-byte card, rounded up to 0.001, at most vLLM's default."""
    return min(VLLM_DEFAULT, math.ceil(1000 * need / total) / 1000)


def gpu_total_bytes(env: dict[str, str] | None = None) -> int | None:
    """Total memory of the first GPU this process may use (CUDA_VISIBLE_DEVICES: an index or a UUID), from
    NVML; None where NVML cannot tell (no nvidia-ml-py, no driver, a MIG slice it cannot name)."""
    env = os.environ if env is None else env
    first = env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            handle = (pynvml.nvmlDeviceGetHandleByIndex(int(first)) if first.isdigit()
                      else pynvml.nvmlDeviceGetHandleByUUID(first))
            return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # ImportError, NVMLError: vLLM's own default stays
        return None
