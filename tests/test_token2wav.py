"""token2wav: whole and streaming synthesis on the golden model, with the official chunk semantics."""
from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F
from conftest import GOLDEN
from safetensors.torch import load_file

from cosy import FlowPrompt, load_token2wav
from cosy.pipeline.token2wav import MelStretcher

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")

CASES = load_file(GOLDEN / "cases.safetensors")
SPF = 480  # samples per mel frame


@pytest.fixture(scope="module")
def t2w():
    return load_token2wav(GOLDEN / "model")


@pytest.fixture(scope="module")
def prompt():
    return FlowPrompt(CASES["flow.prompt_token"], CASES["flow.prompt_feat"], CASES["flow.embedding"])


TOKENS = CASES["flow.token"]  # (1, 60)


def run_stream(t2w, prompt, tokens, step=None, speed=1.0, seed=0):
    s = t2w.stream(prompt, speed=speed, seed=seed)
    ids = tokens.flatten().tolist()
    step = step or len(ids)
    chunks = []
    for i in range(0, len(ids), step):
        chunks += s.push(ids[i:i + step])
    chunks.append(s.finish())
    return chunks


def test_whole_utterance_length_speed_and_seed(t2w, prompt):
    wav = t2w(TOKENS, prompt, seed=3)
    assert wav.shape == (120 * SPF,) and wav.dtype == torch.float32
    assert wav.abs().max() <= 0.99 and wav.abs().max() > 0.01
    assert torch.equal(wav, t2w(TOKENS, prompt, seed=3))
    assert not torch.equal(wav, t2w(TOKENS, prompt, seed=4))
    assert t2w(TOKENS, prompt, speed=1.5, seed=3).shape == (int(120 / 1.5) * SPF,)
    assert t2w(TOKENS, prompt, speed=0.5, seed=3).shape == (240 * SPF,)


def test_mel_and_vocode_match_golden_flow(t2w, prompt):
    mel = t2w.mel(TOKENS, prompt)
    assert (mel - CASES["flow.nonstream.mel"]).abs().max() < 1e-4
    wav = t2w.vocode(mel, seed=1)
    assert wav.shape == (mel.shape[2] * SPF,)


def test_first_chunk_follows_official_schedule(t2w, prompt):
    """20 prompt tokens: the first chunk waits for 25 + 5 (pad to a 25 boundary) + 3 lookahead = 33 tokens,
    and is the HiFT output of the official `flow.stream_first33` mel minus the 3840 held-back samples."""
    s = t2w.stream(prompt, seed=7)
    assert s.push(TOKENS[0, :32].tolist()) == []
    (first,) = s.push(TOKENS[0, 32:33].tolist())
    g = torch.Generator().manual_seed(7)
    expected, _ = t2w.hift.inference(CASES["flow.stream_first33.mel"], generator=g)
    assert first.shape == (60 * SPF - 3840,)
    assert (first - expected[0, :-3840]).abs().max() < 1e-4
    assert s.push(TOKENS[0, 33:].tolist()) == []  # the next hop (50) needs 83 tokens
    last = s.finish()
    assert first.numel() + last.numel() == 120 * SPF  # nothing lost or doubled
    with pytest.raises(RuntimeError, match="finished"):
        s.push([1])


def test_chunking_independent_of_push_granularity_and_hops_grow(t2w, prompt):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 6561, (1, 200), generator=g)
    whole = run_stream(t2w, prompt, tokens)
    one_by_one = run_stream(t2w, prompt, tokens, step=1)
    assert len(whole) == len(one_by_one)
    for a, b in zip(whole, one_by_one):
        assert torch.equal(a, b)
    # hops 30 (25 + pad 5), 50, 100: offsets 30, 80, 180; the rest (20 tokens) comes with finish()
    assert [c.numel() for c in whole[:-1]] == [60 * SPF - 3840, 100 * SPF, 200 * SPF]
    assert sum(c.numel() for c in whole) == 400 * SPF


def test_concurrent_streams_share_no_state(t2w, prompt):
    other = FlowPrompt(CASES["flow.prompt_token"][:, :7], CASES["flow.prompt_feat"][:, :14],
                       -CASES["flow.embedding"])
    alone_a = run_stream(t2w, prompt, TOKENS, step=5, seed=1)
    alone_b = run_stream(t2w, other, TOKENS.flip(1), step=9, seed=2)
    results = {}

    def work(name, p, toks, step, seed):
        results[name] = run_stream(t2w, p, toks, step=step, seed=seed)

    threads = [threading.Thread(target=work, args=("a", prompt, TOKENS, 5, 1)),
               threading.Thread(target=work, args=("b", other, TOKENS.flip(1), 9, 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for mine, alone in ((results["a"], alone_a), (results["b"], alone_b)):
        assert len(mine) == len(alone) and all(torch.equal(x, y) for x, y in zip(mine, alone))


@pytest.mark.parametrize("speed", [0.5, 0.8, 1.3, 2.0])
def test_speed_while_streaming(t2w, prompt, speed):
    chunks = run_stream(t2w, prompt, TOKENS, step=4, speed=speed)
    total = sum(c.numel() for c in chunks)
    assert total == int(120 / speed) * SPF
    assert all(c.abs().max() <= 0.99 for c in chunks if c.numel())


@pytest.mark.parametrize("speed", [0.5, 0.77, 1.0, 1.25, 2.0])
def test_mel_stretcher_matches_linear_interpolation(speed):
    mel = torch.randn(1, 80, 157)
    st = MelStretcher(speed)
    pieces, i = [], 0
    for n in (1, 7, 30, 2, 50, 0, 40):
        pieces.append(st.push(mel[:, :, i:i + n]))
        i += n
    pieces.append(st.push(mel[:, :, i:], final=True))
    ours = torch.cat(pieces, dim=2)
    ref = F.interpolate(mel, scale_factor=1 / speed, mode="linear", recompute_scale_factor=False)
    assert ours.shape[2] == int(157 / speed)
    n = min(ours.shape[2], ref.shape[2])
    # torch computes source positions in float32 (scale 1/(1/speed)); ours in float64
    assert (ours[:, :, :n] - ref[:, :, :n]).abs().max() < 1e-4
