"""`--dtype` on the CPU: the rule (float16 CUDA only), where the half dtype goes (LM, flow estimator) and
where float32 stays (ODE state, flow encoder, fixed noise, HiFT), bfloat16 output within a stated distance
of float32 on the tiny random model, the incremental streaming path in the half dtype, and the engine."""
from __future__ import annotations

import pytest
import torch

from cosy.model.load import load_flow
from cosy.model.precision import resolve_dtype
from cosy.pipeline.engine import Engine
from cosy.pipeline.request import SynthesisRequest
from cosy.pipeline.token2wav import FlowPrompt, load_token2wav

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")


def test_dtype_rule():
    assert resolve_dtype("float32", "cpu") is torch.float32
    assert resolve_dtype("bfloat16", "cpu") is torch.bfloat16
    assert resolve_dtype("float16", "cuda:1") is torch.float16
    with pytest.raises(ValueError, match="needs a CUDA device"):
        resolve_dtype("float16", "cpu")
    with pytest.raises(ValueError, match="must be one of"):
        resolve_dtype("int8", "cuda")


def _prompt_and_tokens(n_prompt=25, n=90):
    g = torch.Generator().manual_seed(0)
    prompt = FlowPrompt(torch.randint(0, 6561, (1, n_prompt), generator=g, dtype=torch.int32),
                        torch.randn(1, 2 * n_prompt, 80, generator=g), torch.randn(1, 192, generator=g))
    return prompt, torch.randint(0, 6561, (1, n), generator=g, dtype=torch.int32)


def test_half_goes_to_the_estimator_only(tiny_model_dir):
    flow = load_flow(tiny_model_dir, dtype=torch.bfloat16)
    assert {p.dtype for p in flow.decoder.estimator.parameters()} == {torch.bfloat16}
    rest = [p for n, p in flow.named_parameters() if not n.startswith("decoder.estimator.")]
    assert rest and {p.dtype for p in rest} == {torch.float32}  # embedding, encoder, projections
    assert flow.decoder.rand_noise.dtype == torch.float32  # the ODE's starting state, not rounded


def test_bfloat16_flow_stays_close_to_float32(tiny_model_dir):
    """Whole-utterance mel and streamed audio (incremental flow, its state in bf16; HiFT fp32) of bf16
    against fp32. Measured on this tiny model (50 prompt + 100 tokens): mel max |diff| 0.017 (max |mel| 4.8, rms diff
    0.004), audio max |diff| 0.0017 (max |audio| 0.15); the bounds leave room for other CPUs."""
    prompt, tokens = _prompt_and_tokens()
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        t2w = load_token2wav(tiny_model_dir, dtype=dtype, cache_mb=64)
        assert t2w.state_budget is not None  # streaming takes the incremental path
        stream = t2w.stream(prompt, seed=0)
        chunks = stream.push(tokens[0].tolist())
        assert len(chunks) >= 2
        out[dtype] = (t2w.mel(tokens, prompt), torch.cat(chunks + [stream.finish()]))
    (mel32, wav32), (mel16, wav16) = out[torch.float32], out[torch.bfloat16]
    assert mel16.dtype == wav16.dtype == torch.float32 and mel16.shape == mel32.shape
    assert (mel16 - mel32).abs().max() < 0.1 and (mel16 - mel32).pow(2).mean().sqrt() < 0.02
    assert wav16.shape == wav32.shape and (wav16 - wav32).abs().max() < 0.02


@pytest.mark.parametrize("model", ["tiny_model_dir", "tiny_cv3_model_dir"])
def test_engine_in_bfloat16(model, request):
    """Both families, streaming and whole (CosyVoice3's DiT once fed its float32 time sinusoid to bfloat16
    weights: every CosyVoice3 request failed in a half dtype; the GPU check's rehearsal found it)."""
    model_dir = request.getfixturevalue(model)
    engine = Engine.from_model_dir(model_dir, dtype="bfloat16")
    assert engine.lm.dtype == torch.bfloat16
    assert next(engine.t2w.flow.decoder.estimator.parameters()).dtype == torch.bfloat16
    # HiFT stays in float32 (CosyVoice3's f0 predictor in float64, as the official casts it)
    assert {p.dtype for p in engine.t2w.hift.parameters()} <= {torch.float32, torch.float64}
    for stream in (True, False):
        req = SynthesisRequest(mode="cross_lingual", text="你好。", prompt_wav="assets/zero_shot_prompt.wav", seed=0,
                               stream=stream, speed=1.5)
        audio = torch.cat(list(engine.synthesize(req)))
        assert audio.dtype == torch.float32 and audio.numel() > 0 and torch.isfinite(audio).all()
    with pytest.raises(ValueError, match="needs a CUDA device"):
        Engine.from_model_dir(model_dir, dtype="float16")
