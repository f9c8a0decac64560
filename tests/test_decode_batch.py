"""Batched decode of the embedded LM (`cosy.lm.decode_batch`, the worker's `--lm_batch`): a batched step equals
each row's solo step, and `BatchedLM.generate` from many threads gives each request its solo tokens, ends and
leaves as `SpeechLM.generate` does."""
from __future__ import annotations

import dataclasses
import threading

import pytest
import torch

from cosy.lm import SpeechLM
from cosy.lm.decode_batch import BatchedLM, decode_step
from cosy.lm.fixed_length import FixedLengthLM

@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    return SpeechLM.from_model_dir(tiny_model_dir)


def prompts(lm, n: int) -> list[torch.Tensor]:
    """n prompts of different lengths (so rows sit at different positions)."""
    return [lm.prompt_embeds(list(range(5, 9 + 3 * i)), [], list(range(10, 14 + 2 * i))) for i in range(n)]


@pytest.mark.quick
@torch.inference_mode()
def test_a_batched_step_equals_each_rows_solo_step(lm):
    embeds = prompts(lm, 3)
    solo, batched = [], []
    for e in embeds:  # solo: prefill, then one step with token 7
        cache, rope = lm._start(e, 4)
        lm._step(e, cache, rope)
        solo.append(lm._step(lm._embed_speech(7), cache, rope)[1])
    states = []
    for e in embeds:
        cache, rope = lm._start(e, 4)
        lm._step(e, cache, rope)
        states.append((cache, rope))
    x = torch.cat([lm._embed_speech(7)] * 3)
    h = decode_step(lm.llm.model.model, x, [c for c, _ in states], [r for _, r in states])
    assert h.shape == (3, 1, lm.cfg.hidden_size) and [c.length for c, _ in states] == [
        e.size(1) + 1 for e in embeds]
    for i in range(3):
        assert (h[i, 0] - solo[i]).abs().max() < 1e-5
    # one row alone: the solo step's arithmetic
    cache, rope = lm._start(embeds[0], 4)
    lm._step(embeds[0], cache, rope)
    alone = decode_step(lm.llm.model.model, lm._embed_speech(7), [cache], [rope])
    assert torch.equal(alone[0, 0], solo[0])


@pytest.mark.quick
def test_threads_get_their_solo_tokens_and_a_leaving_one_is_dropped(lm):
    batched = BatchedLM(lm, max_rows=3)  # 5 requests: a step takes 3 rows, the others wait for the next
    embeds = prompts(lm, 5)
    p = dataclasses.replace(lm.sampling, ignore_stop=True)
    want = [list(lm.generate(e, 30, 30, seed=i, params=p)) for i, e in enumerate(embeds)]
    got: list = [None] * 5
    start = threading.Barrier(6)

    def run(i: int) -> None:
        start.wait()
        tokens = batched.generate(embeds[i], 30, 30, seed=i, params=p)
        if i == 4:  # leaves after 5 tokens
            got[i] = [next(tokens) for _ in range(5)]
            tokens.close()
        else:
            got[i] = list(tokens)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    start.wait()
    for t in threads:
        t.join(120)
    assert got[:4] == want[:4] and got[4] == want[4][:5]
    assert all(len(g) == 30 for g in got[:4])
    # the decode thread dropped every row: a later request decodes alone, as before
    assert list(batched.generate(embeds[0], 30, 30, seed=0, params=p)) == want[0]
    assert not batched._rows


@pytest.mark.quick
def test_stop_tokens_min_and_max_len_as_solo(lm):
    """Without ignore_stop a random tiny LM may stop early: the ends and lengths must be the solo ones."""
    batched = BatchedLM(lm)
    for seed in range(4):
        e = prompts(lm, 1)[0]
        assert list(batched.generate(e, 2, 40, seed=seed)) == list(lm.generate(e, 2, 40, seed=seed))
    assert list(batched.generate(e, 0, 0, seed=1)) == []
    assert len(list(FixedLengthLM(batched, 12).generate(e, 0, 5, seed=3))) == 12


def require_batched(engine) -> None:
    """A worker's prepare hook: fails the worker's start unless `--lm_batch` put a BatchedLM in place."""
    from cosy.lm.decode_batch import BatchedLM
    if not isinstance(engine.lm, BatchedLM):
        raise RuntimeError(f"--lm_batch did not engage: the worker's LM is {type(engine.lm).__name__}")


def test_a_worker_with_lm_batch_gives_each_request_its_solo_audio(tiny_model_dir):
    from conftest import ASSETS, assert_pool_equals_solo

    from cosy.frontend import server
    from cosy.pipeline.engine import Engine, SynthesisRequest
    from cosy.service.workers import EngineSpec

    assert server.parse_args(["--model_dir", str(tiny_model_dir)]).lm_batch == 0
    with pytest.raises(SystemExit):
        server.parse_args(["--model_dir", str(tiny_model_dir), "--lm_batch", "-1"])
    texts = ["今天天气很好。", "我们一起去公园散步，看看花草树木。", "你好。", "希望你以后能够做的比我还好呦。"]
    reqs = [SynthesisRequest(mode="zero_shot", text=t, prompt_text="希望你以后能够做的比我还好呦。",
                             prompt_wav=str(ASSETS / "zero_shot_prompt.wav"), seed=i, stream=True)
            for i, t in enumerate(texts)]
    assert_pool_equals_solo(EngineSpec(str(tiny_model_dir), max_batch=4, lm_batch=4, cache_mb=64), reqs,
                            Engine.from_model_dir(tiny_model_dir, cache_mb=64), prepare=require_batched)
