"""Bistream (text-in streaming) LM decoding against the official decodes of tests/fixtures/golden-bistream,
on the embedded LM and on a real vLLM backend serving the golden model.

Greedy decoding as in the fixture: the embedded backend gets an argmax sampler (with the fixture's scripted
overrides in the `ovr_*` cases); the vLLM backend gets `SamplingParams(greedy=True)` (temperature 0, eos
masked by the logits processor's min_len while the text streams). Requirements (fixture README): yielded,
out_tokens, end, forced fills and every fed position identical; the log-probs of the chosen tokens within
1e-4 (forced fills have no draw on our side: their log-prob is not compared).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import launched_backend

from cosy.lm import SamplingParams, SpeechLM
from cosy.lm.bistream import decode
from cosy.lm.bistream_steps import EmbeddedSteps, RemoteSteps
from cosy.lm.prompt import PromptEmbedder
from cosy.lm.remote import RemoteLM
from cosy.model.families.cosyvoice2 import FAMILY as CV2
from cosy.verify.golden_bistream import greedy_sampler, run_case, sampled_logps, want_of

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN_MODEL = FIXTURES / "golden" / "model"
CASES = json.loads((FIXTURES / "golden-bistream" / "cases.json").read_text())["cases"]
GREEDY_CASES = [c for c in CASES if "sampling_overrides" not in c]
TOL = 1e-4


@pytest.fixture(scope="module")
def golden_lm() -> SpeechLM:
    return SpeechLM.from_model_dir(GOLDEN_MODEL)


@pytest.mark.quick
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_embedded_matches_official(case, golden_lm):
    sampled: list[int] = []
    steps = EmbeddedSteps(golden_lm, sampler=greedy_sampler(case.get("sampling_overrides", {}), sampled),
                          capacity=16, record_logps=True)  # small: the cache grows mid-decode
    got, want = run_case(case, steps), want_of(case)
    assert got == want
    forced = [i for i, t in enumerate(got["out_tokens"]) if i not in set(sampled)]
    assert forced == case["bistream"]["forced_steps"]
    logps = sampled_logps(case)
    assert len(steps.logps) == len(logps)
    assert max((abs(a - b) for a, b in zip(steps.logps, logps)), default=0.0) < TOL


@pytest.mark.quick
def test_fill_and_refeed_rules_are_exercised():
    """The fixture covers what the rules say (guards against a case list that lost its hard cases)."""
    ends = {c["bistream"]["end"] for c in CASES}
    assert ends == {"cap", "eos", "ValueError"}
    refeeds = sum(any(s.get("refeed") for st in c["bistream"]["steps"] for s in st["input"]) for c in CASES)
    assert refeeds >= 8


class Scripted:
    """A StepBackend that yields the given tokens for each call of `run`, in order (no network)."""

    def __init__(self, *runs: list[int]):
        self.runs = list(runs)

    def run(self, block, history, max_new, mask_eos, stop):
        for token in self.runs.pop(0):
            yield token
            if token in stop:
                return


@pytest.mark.quick
@pytest.mark.parametrize("text,runs,token", [
    ([1, 2, 3], [[10, CV2.tokens.fill]], 6563),  # too little text to stream: the final decode emits the fill
    ([1, 2, 3, 4, 5], [[10, 6562]], 6562),  # a stop token while the text streams (eos is masked there)
], ids=["fill_after_the_end", "stop_mid_text"])
def test_a_refused_token_is_a_typed_error_that_says_what_to_do(text, runs, token):
    """The official's ValueError("should not get token N") as a 422 that names the mode, the token and what
    to do instead, with the same status and message after the worker-process hop."""
    from cosy.errors import JobError, Unprocessable
    from cosy.lm.bistream import BistreamError
    with pytest.raises(BistreamError) as caught:
        list(decode([text], [], [], Scripted(*runs), CV2))
    e = caught.value
    assert isinstance(e, Unprocessable) and isinstance(e, ValueError) and e.status == 422
    assert e.official == f"should not get token {token}" and e.token == token
    for words in ("duplex synthesis failed", f"token {token}", e.official, "another seed", "send the text whole"):
        assert words in str(e), str(e)
    assert JobError.wire(e) == ("BistreamError", str(e), 422, None)


@pytest.fixture(scope="module")
def golden_backend(request):
    """A backend on the golden model (launched with the session's backends: conftest.SHARED_BACKENDS)."""
    with launched_backend(request, "golden_backend") as b:
        yield b


@pytest.mark.parametrize("case", GREEDY_CASES, ids=[c["name"] for c in GREEDY_CASES])
def test_vllm_matches_official(case, golden_backend):
    lm = RemoteLM(golden_backend.url, golden_backend.api_key, golden_backend.model_name, stall_timeout=60)
    embedder = PromptEmbedder.from_model_dir(GOLDEN_MODEL)
    steps = RemoteSteps(lm, embedder.segments, SamplingParams(greedy=True), seed=0, record_logps=True)
    got, want = run_case(case, steps), want_of(case)
    assert got == want
    # one completion request per segment: the text blocks plus the final decode
    n_fills = sum(t == CV2.tokens.fill for t in got["out_tokens"])
    assert steps.requests == n_fills + 1 - (got["end"] == "ValueError: should not get token 6563")
    assert steps.length == len(got["positions"])
    logps = sampled_logps(case)
    assert len(steps.logps) == len(logps)
    assert max(abs(a - b) for a, b in zip(steps.logps, logps)) < TOL


def test_vllm_sampled_bistream_is_seeded(golden_backend):
    """RAS sampling on the backend, history carried across segments: same seed, same tokens."""
    case = CASES[1]
    lm = RemoteLM(golden_backend.url, golden_backend.api_key, golden_backend.model_name, stall_timeout=60)
    embedder = PromptEmbedder.from_model_dir(GOLDEN_MODEL)

    def once(seed: int) -> list[int]:
        steps = RemoteSteps(lm, embedder.segments, SamplingParams(), seed=seed)
        tokens = list(decode(case["text_pieces"], case["prompt_text"], case["prompt_speech_token"], steps, CV2,
                             max_final=20))
        assert steps.logps == []  # serving asks the backend for no log-probs (nothing for it to compute)
        return tokens

    a, b = once(5), once(5)
    assert a == b and len(a) >= 60 and all(0 <= t < CV2.tokens.size for t in a)
    assert once(6) != a


def test_engine_duplex_gives_the_same_audio_on_vllm_and_embedded(golden_backend, tiny_model_dir, tmp_path):
    """The whole duplex path (streamed-text normalization, bistream, streaming token2wav), greedy: the vLLM
    backend and the embedded LM make the same tokens, hence the same audio."""
    import shutil

    import torch

    from cosy.pipeline.engine import Engine
    from cosy.pipeline.request import SynthesisRequest

    md = tmp_path / "model"
    shutil.copytree(GOLDEN_MODEL, md)
    for onnx in ("campplus.onnx", "speech_tokenizer_v2.onnx"):  # the golden model has no prompt encoders
        shutil.copy2(tiny_model_dir / onnx, md / onnx)
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):  # the golden tokenizer (ids < 4096)
        shutil.copy2(FIXTURES / "golden" / "tokenizer" / name, md / "CosyVoice-BlankEN" / name)
    embedded = Engine.from_model_dir(md)
    remote = Engine.from_model_dir(md, llm_base_url=golden_backend.url, llm_api_key=golden_backend.api_key)
    pieces = ["The day", " was good,", "", " and"]  # ids < 4096; 6 text tokens: at most 120 speech tokens
    req = SynthesisRequest(mode="cross_lingual", prompt_wav=FIXTURES.parent.parent / "assets" / "zero_shot_prompt.wav",
                           duplex=True, greedy=True, seed=1)
    a = torch.cat(list(embedded.synthesize_duplex(req, iter(pieces))))
    b = torch.cat(list(remote.synthesize_duplex(req, iter(pieces))))
    assert a.numel() == b.numel() >= 24000 * 15 // 25
    assert torch.allclose(a, b, atol=1e-4)
