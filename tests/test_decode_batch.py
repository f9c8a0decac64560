"""Batched decode of the embedded LM (`cosy.lm.decode_batch`, the worker's `--lm_batch`): what the module
promises, no more. A batched step's logits equal each row's solo step's within float rounding (not bit for
bit: a batched matrix product may sum in another order, so a seed may draw another token at a near tie), each
row draws with its own generator, history and sampling parameters, and one row alone is the solo arithmetic
exactly. The threaded and worker tests record what each row computed and drew (`record_takes`) and check it
against the solo LM fed the same tokens (`assert_as_solo`), instead of asking for the solo run's tokens."""
from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest
import torch

from cosy.lm import SpeechLM, decode_batch
from cosy.lm.decode_batch import BatchedLM, _Row, decode_step
from cosy.lm.fixed_length import FixedLengthLM

# a batched step's logits vs the solo step's: float rounding, well inside this; a row that reads another row's
# cache, query or position is off by whole units
TOL = 1e-4


def record_takes(store: dict, folder: Path | None = None):
    """A `_Row.take` that keeps each step's (logits, token drawn or None) in store[the seed of the row's
    generator]; with `folder`, a row's record is saved to folder/<seed>.pt when it ends (a worker's)."""
    take = _Row.take

    def recording(row: _Row, logits: torch.Tensor):
        kept = logits.clone()  # the draw masks stop ids in place
        drawn = len(row.history)
        x = take(row, logits)
        seed = row.gen.initial_seed()
        store.setdefault(seed, []).append((kept, row.history[-1] if len(row.history) > drawn else None))
        if folder is not None and row.done:
            torch.save(store[seed], folder / f"{seed}.pt")
        return x

    return recording


@torch.inference_mode()
def assert_as_solo(lm: SpeechLM, embeds: torch.Tensor, seed: int, params, min_len: int, trace: list) -> list[int]:
    """`trace` (one request's batched steps, the prefill first: the logits and the token drawn, None for a
    stop) is the solo LM's within rounding: fed the same tokens, each solo step's logits are within TOL, and
    each token is the one the request's own generator draws from its own logits and history. Its tokens."""
    p = params or lm.sampling
    gen = torch.Generator().manual_seed(seed)
    stop_ids = lm._stop_ids(p)
    cache, rope = lm._start(embeds, len(trace))
    x, history = embeds, []
    for i, (logits, token) in enumerate(trace):
        solo, _ = lm._step(x, cache, rope)
        off = float((logits - solo).abs().max())
        assert off < TOL, f"seed {seed} step {i}: batched logits are {off:.3g} off the solo step's"
        drawn = lm._draw(logits.clone(), history, p, gen, stop_ids, mask_eos=len(history) < min_len)
        assert drawn == token, f"seed {seed} step {i}: drew {token}, its own generator draws {drawn}"
        if token is None:
            break
        history.append(token)
        x = lm._embed_speech(token)
    return history


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
    solo = []
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
def test_threads_get_their_own_tokens_as_solo_and_a_leaving_one_is_dropped(lm, monkeypatch):
    traces: dict = {}
    rows: list[int] = []  # the rows of each batched step
    monkeypatch.setattr(_Row, "take", record_takes(traces))
    step = decode_batch.decode_step
    monkeypatch.setattr(decode_batch, "decode_step", lambda model, x, *a: rows.append(x.size(0)) or step(model, x, *a))
    batched = BatchedLM(lm, max_rows=3)  # 5 requests: a step takes 3 rows, the others wait for the next
    embeds = prompts(lm, 5)
    p = dataclasses.replace(lm.sampling, ignore_stop=True)
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
    assert max(rows) == 3  # rows decoded together, at most max_rows a step
    for i in range(5):  # each caller got what its own row drew, and that is the solo LM's within rounding
        drew = assert_as_solo(lm, embeds[i], i, p, 30, traces[i])
        assert got[i] == drew[:len(got[i])] and len(got[i]) == (5 if i == 4 else 30)
    # the decode thread dropped every row: a later request decodes alone, the solo arithmetic exactly
    want = list(lm.generate(embeds[0], 30, 30, seed=0, params=p))
    assert list(batched.generate(embeds[0], 30, 30, seed=0, params=p)) == want
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


@dataclasses.dataclass
class RecordRows:
    """A worker's prepare hook: fails the worker's start unless `--lm_batch` put a BatchedLM in place, and has
    each of its rows save its steps to `folder`/<seed>.pt as it ends (`record_takes`)."""
    folder: str

    def __call__(self, engine) -> None:
        if not isinstance(engine.lm, BatchedLM):
            raise RuntimeError(f"--lm_batch did not engage: the worker's LM is {type(engine.lm).__name__}")
        _Row.take = record_takes({}, Path(self.folder))  # the worker's own process, for its life


def test_a_worker_with_lm_batch_gives_each_request_its_tokens_as_solo(tiny_model_dir, tmp_path, monkeypatch):
    """Four requests at once through a worker whose LM decodes them together: each request's LM calls are the
    solo LM's within rounding (`assert_as_solo`), and a request whose tokens are the solo run's has its audio."""
    import numpy as np
    from conftest import ASSETS

    from cosy.frontend import server
    from cosy.pipeline.engine import Engine, SynthesisRequest
    from cosy.service.workers import EngineSpec, WorkerPool

    assert server.parse_args(["--model_dir", str(tiny_model_dir)]).lm_batch == 0
    with pytest.raises(SystemExit):
        server.parse_args(["--model_dir", str(tiny_model_dir), "--lm_batch", "-1"])
    texts = ["今天天气很好。", "我们一起去公园散步，看看花草树木。", "你好。", "希望你以后能够做的比我还好呦。"]
    reqs = [SynthesisRequest(mode="zero_shot", text=t, prompt_text="希望你以后能够做的比我还好呦。",
                             prompt_wav=str(ASSETS / "zero_shot_prompt.wav"), seed=100 * i, stream=True)
            for i, t in enumerate(texts)]  # a text's segment k is seeded seed + k: one LM call per seed
    solo = Engine.from_model_dir(tiny_model_dir, cache_mb=64)
    calls: dict = {}  # seed -> the solo LM call's (embeds, min_len, params, tokens)
    generate = solo.lm.generate

    def keep(embeds, min_len, max_len, seed=None, params=None, **kw):
        tokens = list(generate(embeds, min_len, max_len, seed=seed, params=params, **kw))
        calls[seed] = (embeds, min_len, params, tokens)
        yield from tokens

    monkeypatch.setattr(solo.lm, "generate", keep)
    want = [np.concatenate([c.numpy() for c in solo.synthesize(r)]) for r in reqs]
    pool = WorkerPool(EngineSpec(str(tiny_model_dir), max_batch=4, lm_batch=4, cache_mb=64), workers=1)
    pool.worker_prepare = RecordRows(str(tmp_path))
    pool.start()
    try:
        got: dict = {}

        def run(i: int, r: SynthesisRequest) -> None:
            got[i] = np.concatenate(list(pool.synthesize(r)))

        threads = [threading.Thread(target=run, args=(i, r)) for i, r in enumerate(reqs)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        pool.close()
    for i, r in enumerate(reqs):
        seeds = sorted(s for s in calls if r.seed <= s < r.seed + 100)
        as_solo = []
        for s in seeds:
            embeds, min_len, params, tokens = calls[s]
            trace = torch.load(tmp_path / f"{s}.pt")
            as_solo.append(assert_as_solo(solo.lm, embeds, s, params, min_len, trace) == tokens)
        assert seeds and got[i].size, i
        if all(as_solo):  # else a near tie drew another token there: other audio, as the module says
            assert got[i].shape == want[i].shape and np.abs(got[i] - want[i]).max() < 1e-4, i
