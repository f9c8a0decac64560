"""The backend's start-up warm-up (`cosy.deploy.backend.warmup_body`) takes the paths a first request would
otherwise pay for: the duplex decode asks vLLM for a log-prob per token (`RemoteSteps` -> `RemoteLM.complete`
with `logps`), and vLLM compiles its log-prob kernel on the first such request: the first WebSocket task
after a start waited for that compilation, later ones did not."""
from __future__ import annotations

import base64
import io

import pytest
import torch
from safetensors.torch import save_file

from cosy.deploy.backend import warmup_body
from cosy.lm.export import WEIGHTS

pytestmark = pytest.mark.quick


def test_the_warm_up_asks_for_log_probs_by_token_id(tmp_path):
    save_file({"model.embed_tokens.weight": torch.randn(64, 8)}, str(tmp_path / WEIGHTS))
    body = warmup_body(tmp_path, "cosyvoice2-x")
    # as RemoteLM asks for them: the backend has no tokenizer, so log-probs come keyed by token id
    assert body["logprobs"] == 1 and body["return_tokens_as_token_ids"] is True
    assert body["model"] == "cosyvoice2-x" and body["max_tokens"] == 2 and body["temperature"] == 0.0
    rows = torch.load(io.BytesIO(base64.b64decode(body["prompt_embeds"])))
    assert rows.shape == (4, 8)
