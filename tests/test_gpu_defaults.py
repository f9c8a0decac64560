"""GPU defaults that can be checked without a GPU: the backend's KV budget instead of vLLM's 0.9 share."""
from __future__ import annotations

import json

import pytest

from cosy.deploy.backend import kv_cache_bytes, parse_args, vllm_command

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")

QWEN05 = {"hidden_size": 896, "num_attention_heads": 14, "num_key_value_heads": 2, "num_hidden_layers": 24}


def _cmd(tmp_path, *argv, gpu=True):
    (tmp_path / "config.json").write_text(json.dumps(QWEN05))
    args, extra = parse_args(["--model_dir", str(tmp_path), "--no_api_key", *argv])
    return vllm_command(args, tmp_path, "m", gpu, extra)[0]


def test_gpu_backend_takes_a_kv_budget_not_a_share(tmp_path):
    cmd = _cmd(tmp_path)
    size = int(cmd[cmd.index("--kv-cache-memory-bytes") + 1])
    assert size == kv_cache_bytes(tmp_path, "bfloat16", 64, 4096)
    assert 2.5 * 2 ** 30 < size < 4 * 2 ** 30  # 12 KiB per token in bf16, 64 x 4096 tokens, +10 %
    assert "--gpu-memory-utilization" not in cmd


def test_explicit_choices_win(tmp_path):
    cmd = _cmd(tmp_path, "--gpu_memory_utilization", "0.3")
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.3" and "--kv-cache-memory-bytes" not in cmd
    cmd = _cmd(tmp_path, "--kv_cache_gib", "1.5")
    assert cmd[cmd.index("--kv-cache-memory-bytes") + 1] == str(int(1.5 * 2 ** 30))
    assert "--kv-cache-memory-bytes" not in _cmd(tmp_path, gpu=False)  # CPU: VLLM_CPU_KVCACHE_SPACE


def test_onnx_warns_when_cuda_is_asked_for_but_not_used(tiny_model_dir, monkeypatch, caplog):
    import torch

    from cosy.prompt import onnx_models

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU, but the CPU onnxruntime
    onnx = sorted(tiny_model_dir.glob("speech_tokenizer*.onnx"))[0]
    with caplog.at_level("WARNING", logger="cosy.prompt.onnx_models"):
        s = onnx_models._session(onnx, 1, ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert s.get_providers() == ["CPUExecutionProvider"]
    assert "runs on the CPU" in caplog.text and "onnxruntime-gpu" in caplog.text


def test_a_fixed_kv_cache_comes_with_the_share_it_needs(tmp_path):
    """vLLM checks at start-up that free memory covers --gpu-memory-utilization x the card (0.92 by default,
    even with a fixed KV cache): the backend passes weights + cache + headroom as a share of the card instead,
    so it starts beside frontends that hold memory on the same GPU."""
    import numpy as np
    from safetensors.numpy import save_file

    from cosy.deploy.gpu_memory import HEADROOM, gpu_total_bytes, memory_share, weight_bytes
    save_file({"a": np.zeros((1000, 500), np.float32), "b": np.zeros(250_000, np.float32)},
              str(tmp_path / "model.safetensors"))
    assert weight_bytes(tmp_path / "model.safetensors", "bfloat16") == 750_000 * 2  # fp32 stored, bf16 served
    h200 = 141 * 10**9
    cmd = _cmd_total(tmp_path, h200)
    size = int(cmd[cmd.index("--kv-cache-memory-bytes") + 1])
    share = float(cmd[cmd.index("--gpu-memory-utilization") + 1])
    assert share == memory_share(1_500_000 + size + HEADROOM, h200) and 0.03 < share < 0.05
    assert share * h200 >= 1_500_000 + size + HEADROOM  # rounded up, never short
    assert memory_share(10**12, h200) == 0.92  # a small card: never more than vLLM's own default
    cmd = _cmd_total(tmp_path, h200, "--gpu_memory_utilization", "0.3")  # the user's share wins
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.3"
    assert "--gpu-memory-utilization" not in _cmd(tmp_path)  # NVML could not tell: vLLM's default
    import importlib.util
    if importlib.util.find_spec("pynvml") is None:  # no nvidia-ml-py (the CPU installs): no share passed
        assert gpu_total_bytes({"CUDA_VISIBLE_DEVICES": "0"}) is None


def _cmd_total(tmp_path, total, *argv):
    (tmp_path / "config.json").write_text(json.dumps(QWEN05))
    args, extra = parse_args(["--model_dir", str(tmp_path), "--no_api_key", *argv])
    return vllm_command(args, tmp_path, "m", True, extra, gpu_total=total)[0]
