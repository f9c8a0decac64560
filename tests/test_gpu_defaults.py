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
