"""The CosyVoice3 LM on the vLLM backend: export layout, the logits processor with CosyVoice3's stop set and
min-len quirk, and a real `launch/backend.py` on a tiny random CosyVoice3 LM against the embedded LM."""
from __future__ import annotations

import collections
import json
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from test_backend_server import ALPHA, _chi_square_p, _draw_many, _ras_body, encode_embeds

from cosy.lm import SamplingParams, SpeechLM, ras_distribution
from cosy.lm.export import export_for_vllm, llm_fingerprint, served_model_name
from cosy.lm.remote import RemoteLM
from cosy.model.families.cosyvoice3 import FAMILY as CV3

TOKENS = CV3.tokens
TEXT, PROMPT_TEXT, PROMPT_SPEECH = [101, 202, 303, 404, 151646], [7, 8], [11, 12, 13]


@pytest.fixture(scope="module")
def cv3_dir(tiny_cv3_model_dir):
    return tiny_cv3_model_dir  # the session's model (conftest), so `cv3_backend` starts vLLM once per session


@pytest.fixture(scope="module")
def cv3_lm(cv3_dir) -> SpeechLM:
    return SpeechLM.from_model_dir(cv3_dir)


@pytest.mark.quick
def test_export_layout(cv3_dir, tmp_path):
    out = export_for_vllm(cv3_dir, tmp_path)
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["architectures"], cfg["cosy_family"], cfg["vocab_size"]) == (["CosyVoice3ForCausalLM"], "cosyvoice3",
                                                                             6761)
    assert cfg["tie_word_embeddings"] is False
    sd = torch.load(cv3_dir / "llm.pt", weights_only=True)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        assert "lm_head.bias" not in keys and {"model.embed_tokens.weight", "lm_head.weight"} <= keys
        assert torch.equal(f.get_tensor("model.embed_tokens.weight"), sd["speech_embedding.weight"])
        assert torch.equal(f.get_tensor("lm_head.weight"), sd["llm_decoder.weight"])
    fp = llm_fingerprint(cv3_dir, tmp_path)
    assert out.name == "cosyvoice3-" + fp and served_model_name(fp, CV3) == "cosyvoice3-" + fp[:16]


@pytest.mark.quick
def test_processor_masks_sos_not_eos_below_min_len():
    """CosyVoice3's quirk in the processor: before min_len id 6561 (sos) is -inf, eos 6562 and the other
    stop ids stay; cosy_ignore_stop masks all 200 stop ids."""
    from cosy.vllm_plugin import hide_torch_addons

    hide_torch_addons()
    from vllm import SamplingParams as VllmParams
    from vllm.v1.sample.logits_processor import BatchUpdate

    from cosy.vllm_plugin.ras import CosyLogitsProcessor

    config = SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace(cosy_family=CV3.name)))
    proc = CosyLogitsProcessor(config, torch.device("cpu"), False)
    p = SamplingParams()
    ras = {"cosy_ras": 1, "cosy_top_p": p.top_p, "cosy_top_k": p.top_k, "cosy_win": p.win_size, "cosy_tau": p.tau_r}
    logits = torch.randn(3, 6761, generator=torch.Generator().manual_seed(0)) * 3
    logits[:, 6561:6563] += 20  # sos and eos on top
    outs = [[1, 2], [], [5]]
    params = [VllmParams(temperature=0.0, extra_args={"cosy_min_len": 3}),
              VllmParams(extra_args={**ras, "cosy_min_len": 2}),
              VllmParams(temperature=0.0, extra_args={"cosy_ignore_stop": 1})]
    proc.update_state(BatchUpdate(3, [], [(i, params[i], None, outs[i]) for i in range(3)], []))
    y = proc.apply(logits.clone())
    assert y[0, 6561] == float("-inf") and torch.equal(y[0, 6562:], logits[0, 6562:])
    assert torch.equal(y[0, :6561], logits[0, :6561])
    want = ras_distribution(logits[1], [], p, mask_eos=True, tokens=TOKENS)
    assert want[6561] == 0 and want[6562] > 0.5
    torch.testing.assert_close(y[1].double().softmax(0), want, atol=1e-6, rtol=0)
    assert bool((y[2, 6561:] == float("-inf")).all()) and torch.equal(y[2, :6561], logits[2, :6561])


def test_greedy_through_the_client_matches_embedded_lm(cv3_backend, cv3_lm):
    x = cv3_lm.prompt_embeds(TEXT, PROMPT_TEXT, PROMPT_SPEECH)
    min_len, max_len = cv3_lm.length_limits(len(TEXT))
    greedy = SamplingParams(greedy=True)
    want = list(cv3_lm.generate(x, min_len, max_len, params=greedy))
    remote = RemoteLM(cv3_backend.url, cv3_backend.api_key, cv3_backend.model_name, family=CV3)
    remote.check()
    assert list(remote.generate(x, min_len, max_len, params=greedy)) == want and len(want) >= min_len
    # fixed-length runs (no stop at all) agree too: 6561..6760 masked on both sides
    fixed = SamplingParams(greedy=True, ignore_stop=True)
    assert list(remote.generate(x, 0, 40, params=fixed)) == list(cv3_lm.generate(x, 0, 40, params=fixed))


def test_seeded_ras_first_token_matches_embedded_lm(cv3_backend, cv3_lm):
    """N seeded first tokens against ras_distribution of our LM's logits (min_len masks sos, not eos)."""
    n, p = 300, cv3_lm.sampling
    x = cv3_lm.prompt_embeds(TEXT, PROMPT_TEXT, PROMPT_SPEECH)
    logp0 = cv3_lm.teacher_forced_logprobs(x, [0])[0][0]
    top = logp0.exp().sort(descending=True).values
    assert (top[p.top_k - 1] - top[p.top_k]) / top[p.top_k - 1] > 1e-3  # no near-tie at the nucleus edge
    body = _ras_body(encode_embeds(x), p, min_len=1)
    firsts = _draw_many(cv3_backend, body, n, max_tokens=1)
    want = ras_distribution(logp0, [], p, True, tokens=TOKENS)
    assert _chi_square_p(collections.Counter(t[0] for t in firsts), want, n) > ALPHA
    assert _draw_many(cv3_backend, body, 8, max_tokens=1) == firsts[:8]  # same seeds, same tokens


def test_a_frontend_of_the_other_family_is_refused_clearly(cv3_backend, cv3_dir):
    from cosy.lm.remote import BackendError
    from cosy.model.families.cosyvoice2 import FAMILY as CV2

    fp = llm_fingerprint(cv3_dir, cv3_backend.cache_dir)
    remote = RemoteLM(cv3_backend.url, cv3_backend.api_key, served_model_name(fp, CV2), family=CV2)
    with pytest.raises(BackendError, match="serves a cosyvoice3 model .* this frontend's model directory is "
                                           "cosyvoice2: start the backend on the same model directory"):
        remote.check()
