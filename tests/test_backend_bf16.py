"""The vLLM backend in bfloat16 on the CPU (`launch/backend.py --dtype bfloat16`), end to end on the tiny models:
vLLM's CPU kernels, our plugin and the exported weights serve tokens with RAS sampling, and the logits that
the sampling reads are float32 products (config.json's head_dtype, the plugin's float32 head), not bfloat16
values, within bfloat16 rounding of the float32 embedded LM's."""
from __future__ import annotations

import dataclasses
import json

import openai
import pytest
import torch
from servers import Backend
from test_backend_server import PROMPT_SPEECH, PROMPT_TEXT, TEXT, encode_embeds

from cosy.lm import SpeechLM
from cosy.lm.export import export_for_vllm
from cosy.lm.remote import RemoteLM
from cosy.model.files import ModelDir


@pytest.fixture(scope="module")
def model(tiny_cv3_model_dir):
    """One family end to end (a vLLM start is the suite's costliest step): CosyVoice3, whose head has no bias;
    the export's float32 head of CosyVoice2 is checked without a backend below, and the plugin's code is the
    same for both families."""
    return tiny_cv3_model_dir


@pytest.fixture(scope="module")
def bf16_backend(model, tmp_path_factory):
    folder = tmp_path_factory.mktemp("bf16_backend")
    # raw_logits: a completion's logprobs are the logits themselves (before any processor), to check their dtype
    b = Backend(model, folder / "cache", folder / "backend.log",
                extra=("--dtype", "bfloat16", "--", "--logprobs-mode", "raw_logits"))
    try:
        b.start()
        yield b
    finally:
        b.stop()


def test_export_asks_for_a_float32_head(tiny_model_dir, tmp_path):
    cfg = json.loads((export_for_vllm(tiny_model_dir, tmp_path) / "config.json").read_text())
    assert cfg["head_dtype"] == "float32"


def test_bfloat16_backend_serves_ras_tokens(bf16_backend, model):
    family = ModelDir(model).family
    lm = SpeechLM.from_model_dir(model)
    remote = RemoteLM(bf16_backend.url, bf16_backend.api_key, bf16_backend.model_name, family=family)
    remote.check()
    x = lm.prompt_embeds(TEXT, PROMPT_TEXT, PROMPT_SPEECH)
    params = dataclasses.replace(lm.sampling, ignore_stop=True)  # RAS, stop ids masked: exactly 30 tokens
    tokens = list(remote.generate(x, 30, 30, seed=5, params=params))
    assert len(tokens) == 30 and all(0 <= t < family.tokens.vocab for t in tokens)
    assert list(remote.generate(x, 30, 30, seed=5, params=params)) == tokens  # seeded


def test_bfloat16_backend_logits_are_float32(bf16_backend, model):
    lm = SpeechLM.from_model_dir(model)
    x = lm.prompt_embeds(TEXT, PROMPT_TEXT, PROMPT_SPEECH)
    client = openai.OpenAI(base_url=bf16_backend.url, api_key=bf16_backend.api_key, max_retries=0)
    r = client.completions.create(model=bf16_backend.model_name, prompt=None, max_tokens=1, temperature=0.0,
                                  logprobs=20, extra_body={"prompt_embeds": encode_embeds(x),
                                                           "return_tokens_as_token_ids": True})
    top = r.choices[0].logprobs.top_logprobs[0]  # {token: raw logit}, the 20 largest
    ids = torch.tensor([int(t.removeprefix("token_id:")) for t in top])
    got = torch.tensor(list(top.values()), dtype=torch.float32)
    assert len(got) == 20
    # a bfloat16 head gives bf16 values (8 significant bits); float32 products almost never are
    assert (got.bfloat16().float() != got).float().mean() > 0.8, got
    logits = lm._step(x, *lm._start(x, 1))[0]  # the float32 embedded LM's
    # measured: within 0.03 of the float32 logits (max |logit| 10.6), none of the 20 a bf16 value
    assert (got - logits[ids]).abs().max() < 0.2
