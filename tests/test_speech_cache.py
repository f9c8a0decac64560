"""Streaming that computes only new frames (cosy.flow.incremental + cosy.speech.cache) equals the
recomputing path: mel within 1e-5, audio within 1e-4, for every prompt kind, speed and push pattern."""
from __future__ import annotations

import pytest
import torch
from conftest import GOLDEN
from safetensors.torch import load_file

from cosy import FlowPrompt, load_token2wav
from cosy.flow import incremental
from cosy.speech.cache import StateBudget

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")

CASES = load_file(GOLDEN / "cases.safetensors")
TOKENS = CASES["flow.token"].flatten().tolist() * 2  # 120 tokens: several chunks, hops 25 -> 50 -> 100


@pytest.fixture(scope="module")
def plain():
    return load_token2wav(GOLDEN / "model")


@pytest.fixture(scope="module")
def cached():
    return load_token2wav(GOLDEN / "model", cache_mb=256)


def golden_prompt(key=None):
    return FlowPrompt(CASES["flow.prompt_token"], CASES["flow.prompt_feat"], CASES["flow.embedding"], key)


def long_prompt(key=None):
    """A 62-token prompt: two chunks are final without target tokens (the saved-voice cache's case)."""
    g = torch.Generator().manual_seed(5)
    tokens = torch.cat([CASES["flow.prompt_token"]] * 3 + [CASES["flow.prompt_token"][:, :2]], dim=1)
    mel = torch.randn(1, 2 * tokens.shape[1], 80, generator=g) * 0.5 - 5
    return FlowPrompt(tokens, mel, CASES["flow.embedding"], key)


def run(t2w, prompt, step, speed, seed=1, ahead=False):
    """The stream's HiFT inputs and audio chunks; `ahead`: token by token, as the engine pushes them, with
    the prompt's last chunk computed ahead of the first chunk (`compute_ahead`), checked to have run."""
    mels, real = [], t2w.hift.inference

    def spy(mel, *a, **k):
        mels.append(mel.clone())
        return real(mel, *a, **k)

    t2w.hift.inference = spy
    try:
        s = t2w.stream(prompt, speed=speed, seed=seed)
        chunks = []
        for i in range(0, len(TOKENS), step):
            if ahead:
                s.add(TOKENS[i:i + step])
                if s.ahead_due():
                    assert len(s.tokens) == s.first_pad + t2w.lookahead and s.held is None
                    s.compute_ahead()
                    assert s.held is not None and s.held.shape[2] == 2 * s.first_pad and not mels
            chunks += s.push(TOKENS[i:i + step] if not ahead else [])
        assert s.ahead_done == ahead
        chunks.append(s.finish())
    finally:
        del t2w.hift.inference
    return mels, chunks


def assert_same(a, b):
    (mels_a, wav_a), (mels_b, wav_b) = a, b
    assert len(mels_a) == len(mels_b) >= 3 and len(wav_a) == len(wav_b)
    for x, y in zip(mels_a, mels_b):
        assert x.shape == y.shape and (x - y).abs().max() < 1e-5
    for x, y in zip(wav_a, wav_b):
        assert x.shape == y.shape and (x - y).abs().max() < 1e-4


@pytest.mark.parametrize("make_prompt,step,speed", [(golden_prompt, 1, 1.0), (long_prompt, 7, 0.5),
                                                    (long_prompt, 40, 1.7), (golden_prompt, 3, 2.0)])
def test_cached_stream_equals_recompute(plain, cached, make_prompt, step, speed):
    assert_same(run(plain, make_prompt(), step, speed), run(cached, make_prompt(), step, speed))
    assert cached.state_budget.used() == 0  # a finished stream holds nothing


@pytest.mark.parametrize("make_prompt,key,speed", [
    (golden_prompt, None, 1.0), (long_prompt, None, 1.0), (long_prompt, "voice-ahead", 1.0),
    (long_prompt, "voice-ahead", 0.5)])
def test_prompt_chunk_computed_ahead_equals_recompute(plain, make_prompt, key, speed):
    """The frames that complete the prompt's last chunk, computed once its pad tokens are there (while the
    LM makes the rest of the first chunk), then the first chunk from their state: the same chunks."""
    cached = load_token2wav(GOLDEN / "model", cache_mb=256)  # its own budget: the other tests count theirs
    want = run(plain, make_prompt(), 1, speed)
    for _ in range(2 if key else 1):  # a saved voice: its prompt state computed, then reused
        assert_same(want, run(cached, make_prompt(key), 1, speed, ahead=True))
    assert cached.state_budget.used() == cached.state_budget._voice_bytes  # the streams hold nothing now


def test_saved_voice_prompt_state_is_computed_once_and_shared(plain, cached):
    want = run(plain, long_prompt(), 1, 1.0)
    n = incremental.prompt_frames(cached.flow, long_prompt().tokens.shape[1])
    assert n == 100  # chunks 0 and 1 (tokens 0..49): look-ahead 50..52 is still prompt
    for _ in range(2):
        assert_same(want, run(cached, long_prompt("voice-a"), 1, 1.0))
        state = cached.state_budget.voice("voice-a")
        assert state is not None and state.frames == n
    assert cached.state_budget.used() == state.nbytes


def test_over_budget_falls_back_to_recompute(plain):
    t2w = load_token2wav(GOLDEN / "model", cache_mb=1)
    t2w.state_budget = StateBudget(10_000)  # smaller than any state
    assert_same(run(plain, long_prompt(), 7, 1.0), run(t2w, long_prompt("v"), 7, 1.0))
    assert t2w.state_budget.used() == 0 and t2w.state_budget.voice("v") is None


def test_state_budget_lru():
    st = incremental.FlowState(4, ({"a": torch.zeros(100)},))  # 400 bytes
    b = StateBudget(1000, voice_share=0.9)
    assert b.put_voice("x", st) and b.put_voice("y", st)
    assert b.voice("x") is st  # x is now the most recent
    assert b.put_voice("z", st) and b.voice("y") is None and b.voice("x") is st
    assert not b.charge(1, 300) and b.charge(2, 200) and b.used() == 1000
    b.release(2)
    assert b.used() == 800


def test_a_stream_collected_inside_the_budgets_lock_does_not_deadlock():
    """The garbage collector runs finalizers at any allocation, also inside a budget method that holds its
    lock: a stream in a reference cycle (as an interrupted job leaves one) released from its `__del__` there.
    Before, that waited for ever on the same thread (CI's worker stuck busy after a cancel). The collection
    lands at each allocation of `charge`; it must finish, and the collected streams' bytes must be dropped."""
    from conftest import finalizers_inside
    t2w = load_token2wav(GOLDEN / "model", cache_mb=256)
    budget = t2w.state_budget

    def garbage_stream() -> None:
        s = t2w.stream(golden_prompt(), speed=1.0, seed=1)
        s.cycle = s  # only the collector frees it
        assert budget.charge(id(s), 1000)

    assert finalizers_inside(garbage_stream, lambda: budget.charge(-1, 10), within=60), \
        "a finalizer waited on the budget's lock held by its own thread"
    assert budget.used() == 10  # only the live charge: every collected stream's bytes were dropped
