"""The backend's start-up warm-up (`cosy.deploy.backend.warmup_body`) and what a first request asks of vLLM.
vLLM compiles its log-prob path on the first request that asks for log-probs; the duplex decode asked for
them on every segment (only to compare decodes with the official one), so the first WebSocket task after a
start waited for that compilation. Serving now asks for none (`RemoteSteps(record_logps=False)`, the
default), so neither the warm-up nor a first task pays for it; the verification paths still record them."""
from __future__ import annotations

import base64
import inspect
import io

import pytest
import torch
from safetensors.torch import save_file

from cosy.deploy.backend import warmup_body
from cosy.lm.bistream_steps import EmbeddedSteps, RemoteSteps
from cosy.lm.export import WEIGHTS

pytestmark = pytest.mark.quick


def test_the_warm_up_is_a_short_greedy_completion_without_log_probs(tmp_path):
    save_file({"model.embed_tokens.weight": torch.randn(64, 8)}, str(tmp_path / WEIGHTS))
    body = warmup_body(tmp_path, "cosyvoice2-x")
    assert body["model"] == "cosyvoice2-x" and body["max_tokens"] == 2 and body["temperature"] == 0.0
    assert "logprobs" not in body
    rows = torch.load(io.BytesIO(base64.b64decode(body["prompt_embeds"])))
    assert rows.shape == (4, 8)


def test_serving_decodes_record_no_log_probs_unless_asked():
    for steps in (EmbeddedSteps, RemoteSteps):
        assert inspect.signature(steps).parameters["record_logps"].default is False, steps
