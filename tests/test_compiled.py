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


def test_compiled_flow_equals_eager(tiny_model_dir, inputs):
    prompt, tokens = inputs
    eager, fast = load_token2wav(tiny_model_dir, cache_mb=64), load_token2wav(tiny_model_dir, cache_mb=64)
    compiled.compile_flow(fast.flow)
    compiled.warm_up(fast)
    assert (fast.mel(tokens, prompt) - eager.mel(tokens, prompt)).abs().max() < 1e-4
    want, got = stream_mels(eager, prompt, tokens), stream_mels(fast, prompt, tokens)
    assert len(got) == len(want) >= 2
    for a, b in zip(got, want):
        assert a.shape == b.shape and (a - b).abs().max() < 1e-4
    # another length runs on the same graphs (dynamic shapes), still equal
    short = tokens[:, :47]
    assert (fast.mel(short, prompt) - eager.mel(short, prompt)).abs().max() < 1e-4


def test_compiled_lm_equals_eager(tiny_model_dir):
    eager, fast = SpeechLM.from_model_dir(tiny_model_dir), SpeechLM.from_model_dir(tiny_model_dir)
    compiled.compile_lm(fast)
    embeds = eager.prompt_embeds([5, 6, 7, 8, 9], [], [1, 2, 3])
    continuation = [11, 12, 13, 14, 15, 16]
    want, _ = eager.teacher_forced_logprobs(embeds, continuation)
    got, _ = fast.teacher_forced_logprobs(embeds, continuation)
    assert got.shape == want.shape and (got - want).abs().max() < 1e-4
    tokens = list(fast.generate(embeds, min_len=10, max_len=10, seed=1))
    assert len(tokens) == 10 and all(0 <= t < 6561 for t in tokens)


def test_cli_compile_synthesizes_streaming_at_speed(tiny_model_dir, tmp_path):
    """`python -m cosy --compile`: the engine compiles at start-up and streams a zero-shot request."""
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
