"""`--compile` (cosy.pipeline.compiled) on the tiny model: the compiled estimator and LM stack give what the
eager ones give within float rounding, for whole utterances, streaming chunks and the LM's distribution."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from cosy.lm.model import SpeechLM
from cosy.pipeline import compiled
from cosy.pipeline.token2wav import FlowPrompt, load_token2wav


@pytest.fixture(scope="module")
def inputs():
    g = torch.Generator().manual_seed(3)
    prompt = FlowPrompt(torch.randint(0, 6561, (1, 40), generator=g, dtype=torch.int32),
                        0.5 * torch.randn(1, 80, 80, generator=g).transpose(1, 2) - 5,
                        torch.randn(1, 192, generator=g))
    return prompt, torch.randint(0, 6561, (1, 90), generator=g, dtype=torch.int32)


def stream_mels(t2w, prompt, tokens):
    s = t2w.stream(prompt, seed=0)
    mels = s.push_mels(tokens[0].tolist())
    s.close()
    return mels


@pytest.fixture(scope="module")
def inductor(tiny_model_dir):
    """Token2wav (keeping stream state: its incremental graphs too) and the LM compiled with inductor and
    warmed up as `--compile` does at start-up. Their graphs land in inductor's on-disk cache, where the CLI
    test's process, compiling the same graphs, finds them: cold, each costs minutes of CI."""
    t2w, lm = load_token2wav(tiny_model_dir, cache_mb=64), SpeechLM.from_model_dir(tiny_model_dir)
    compiled.compile_flow(t2w.flow)
    compiled.compile_lm(lm)
    compiled.warm_up(t2w, lm)
    return t2w, lm


def test_compiled_flow_equals_eager(tiny_model_dir, inputs, inductor):
    prompt, tokens = inputs
    eager, fast = load_token2wav(tiny_model_dir, cache_mb=64), inductor[0]
    assert (fast.mel(tokens, prompt) - eager.mel(tokens, prompt)).abs().max() < 1e-4
    want, got = stream_mels(eager, prompt, tokens), stream_mels(fast, prompt, tokens)
    assert len(got) == len(want) >= 2
    for a, b in zip(got, want):
        assert a.shape == b.shape and (a - b).abs().max() < 1e-4
    # another length runs on the same graphs (dynamic shapes), still equal
    short = tokens[:, :47]
    assert (fast.mel(short, prompt) - eager.mel(short, prompt)).abs().max() < 1e-4


def test_compiled_lm_equals_eager(tiny_model_dir, inductor):
    eager, fast = SpeechLM.from_model_dir(tiny_model_dir), inductor[1]
    embeds = eager.prompt_embeds([5, 6, 7, 8, 9], [], [1, 2, 3])
    continuation = [11, 12, 13, 14, 15, 16]
    want, _ = eager.teacher_forced_logprobs(embeds, continuation)
    got, _ = fast.teacher_forced_logprobs(embeds, continuation)
    assert got.shape == want.shape and (got - want).abs().max() < 1e-4
    tokens = list(fast.generate(embeds, min_len=10, max_len=10, seed=1))
    assert tokens == list(eager.generate(embeds, min_len=10, max_len=10, seed=1))


@pytest.fixture(scope="module")
def warmed(tiny_model_dir):
    """Token2wav and LM compiled and warmed up as a `--flow_batch 8` worker does at start-up. Dynamo's eager
    backend: the same captured graphs and guards as inductor's (what is compiled when is dynamo's doing),
    without generating kernels, which cold took minutes of CI."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()  # dynamo counts graphs per function, across the compiled copies of earlier tests
    t2w, lm = load_token2wav(tiny_model_dir, cache_mb=64), SpeechLM.from_model_dir(tiny_model_dir)
    compiled.compile_flow(t2w.flow, backend="eager")
    compiled.compile_lm(lm, backend="eager")
    counters.clear()
    compiled.warm_up(t2w, lm, rows=8)
    # every frame dynamo met compiled whole: a graph break it cannot resume from sends a frame back to eager
    # (the LM stack once fell back whole on one, its layers then compiled one by one past the recompile limit)
    assert not counters["graph_break"] and not counters["unimplemented"], dict(counters["unimplemented"])
    assert counters["frames"]["ok"] == counters["frames"]["total"] > 0
    # each graph compiled once, its lengths and batch dynamic from the start (compiled.FLOW_DYNAMIC,
    # LM_DYNAMIC): the flow's forward without and with lengths 2, the incremental function 4 (first chunk,
    # after a state: one row, then rows), the LM stack 3 (prefill, decode step, chunk); 17 when each graph
    # was compiled static at its first size and again dynamic at its second
    assert counters["stats"]["unique_graphs"] == 9, dict(counters["stats"])
    return t2w, lm


def test_warm_up_leaves_no_compile_to_requests(warmed):
    """After warm_up, requests of new lengths (prompts, utterances, streams, LM prompts and caches, the
    bistream chunk after a cache) run on the graphs already compiled: none recompiles in a request."""
    t2w, lm = warmed
    g = torch.Generator().manual_seed(5)
    with torch.compiler.set_stance("fail_on_recompile"), torch.inference_mode():
        for n_prompt, n in ((41, 130), (17, 150)):
            prompt = FlowPrompt(torch.randint(0, 6561, (1, n_prompt), generator=g, dtype=torch.int32),
                                torch.randn(1, 2 * n_prompt, 80, generator=g) - 5, torch.randn(1, 192, generator=g))
            tokens = torch.randint(0, 6561, (1, n), generator=g, dtype=torch.int32)
            t2w.mel(tokens, prompt)
            assert len(stream_mels(t2w, prompt, tokens)) >= 2
        # batches of another size: whole utterances, and streams' chunks at the same place
        t2w.run_jobs([t2w.whole_job(tokens[:, :n - 9 * i], prompt) for i in range(4)])
        streams = [t2w.stream(prompt, seed=i) for i in range(4)]
        for s in streams:
            s.add(tokens[0].tolist())
        chunks = 0
        while all(s.due() for s in streams):
            chunks += 1
            assert all(isinstance(m, torch.Tensor) for m in t2w.run_chunks([s.chunk_job() for s in streams]))
        assert chunks >= 2  # the first alone (no state yet), then batched
        for n in (13, 21):
            embeds = lm.prompt_embeds(list(range(n)), [3, 4], [5, 6, 7])
            assert len(list(lm.generate(embeds, min_len=4, max_len=4, seed=0))) == 4
            cache, rope = lm._start(embeds, 30)
            for x in (embeds, *(torch.randn(1, k, lm.cfg.hidden_size, generator=g) for k in (1, 7, 1, 9))):
                lm._step(x, cache, rope)


def test_cli_compile_synthesizes_streaming_at_speed(tiny_model_dir, tmp_path):
    """`python -m cosy --compile`: the engine compiles at start-up (its graphs mostly from the on-disk cache
    the `inductor` fixture filled) and streams a zero-shot request."""
    import subprocess
    import sys

    import soundfile as sf
    from conftest import ASSETS

    out = tmp_path / "c.wav"
    r = subprocess.run([sys.executable, "-m", "cosy", "--model_dir", str(tiny_model_dir), "--mode", "zero_shot",
                        "--text", "你好，世界。今天天气很好。", "--prompt_text", "希望你以后能够做的比我还好呦。",
                        "--prompt_wav", str(ASSETS / "zero_shot_prompt.wav"), "--stream", "--speed", "1.5",
                        "--seed", "1", "--compile", "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    wav, sr = sf.read(out)
    assert sr == 24000 and len(wav) > 0 and np.isfinite(wav).all()
