"""`--dtype` on the CPU: the rule (float16 CUDA only; `auto` per role from the CPU's bfloat16 units), where
the half dtype goes (LM backbone, flow estimator) and where float32 stays (ODE state, flow encoder, fixed
noise, HiFT, the LM's head and logits), the embedded LM's prepacked bfloat16 weights, bfloat16 output within
a stated distance of float32 on the tiny random model, the incremental streaming path and the batched flow
and decode in the half dtype, and the engine."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cosy.lm.model import SpeechLM
from cosy.lm.qwen2 import Linear
from cosy.model.load import load_flow
from cosy.model.precision import (
    AUTO_CPU_ROLES,
    DTYPE_CHOICES,
    ROLES,
    auto_dtype,
    cpu_bf16_units,
    describe,
    resolve_dtype,
)
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
    with pytest.raises(ValueError, match="must be one of float32, bfloat16, float16, auto"):
        resolve_dtype("int8", "cuda")
    assert "auto" in DTYPE_CHOICES


def test_bf16_units_from_the_flags_and_onednn_isa_cap():
    both = {"avx512f", "avx512_bf16", "amx_bf16", "amx_tile"}
    assert cpu_bf16_units(both, "") == "AMX-BF16"
    assert cpu_bf16_units(both, "ALL") == "AMX-BF16"
    assert cpu_bf16_units(both, "AVX512_CORE_BF16") == "AVX512-BF16"  # AMX hidden from oneDNN
    assert cpu_bf16_units(both, "AVX512_CORE") is None
    assert cpu_bf16_units(both, "AVX2") is None
    assert cpu_bf16_units({"avx512f", "avx512_bf16"}, "") == "AVX512-BF16"
    assert cpu_bf16_units({"avx2", "fma"}, "") is None  # e.g. AMD Zen 3, Intel Skylake: no unit
    assert cpu_bf16_units(set(), "") is None


def test_auto_picks_per_role_from_the_units(monkeypatch):
    unit = cpu_bf16_units()
    for role in ROLES:
        name, why = auto_dtype("cpu", role)
        assert name == ("bfloat16" if unit in AUTO_CPU_ROLES[role] else "float32") and why
        assert resolve_dtype("auto", "cpu", role) is getattr(torch, name)
    line = describe("auto", "cpu", ROLES)
    assert line.startswith("auto: LM ") and "flow " in line and "backend " in line and (unit or "no bfloat16") in line
    assert describe("float32", "cpu") == "LM float32, flow float32"
    assert describe("bfloat16", "cpu", ("flow",)) == "flow bfloat16"
    assert describe("bfloat16", "cpu").startswith("LM bfloat16, flow bfloat16; the LM's ")
    # AVX512-BF16 without AMX (oneDNN capped below AMX stands in for one): the LM's decode gains, the flow not
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
    if unit is not None:
        assert [auto_dtype("cpu", r)[0] for r in ROLES] == ["bfloat16", "float32", "float32"]
        assert auto_dtype("cpu", "flow")[1] == "the CPU has AVX512-BF16, which the flow does not gain from"
    # a CPU without the units: float32 for every role
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")
    assert cpu_bf16_units() is None
    none = "the CPU has no bfloat16 matrix unit, neither AMX-BF16 nor AVX512-BF16"
    assert all(auto_dtype("cpu", r) == ("float32", none) for r in ROLES)
    assert resolve_dtype("auto", "cpu", "flow") is torch.float32
    with pytest.raises(ValueError, match="role must be one of"):
        auto_dtype("cpu", "hift")


def test_auto_in_every_role_s_flags(monkeypatch):
    """`--dtype auto` is accepted by the frontend, the CLI and the backend, which hands vLLM what the rule
    picked for it (vLLM's own `auto`, the checkpoint's dtype, is not what it means here)."""
    from pathlib import Path

    from cosy.__main__ import parse_args as cli_args
    from cosy.deploy.backend import parse_args as backend_args
    from cosy.deploy.backend import vllm_command
    from cosy.frontend.options import parse_args as app_args
    assert app_args(["--device", "cpu", "--dtype", "auto"]).dtype == "auto"
    assert cli_args(["--model_dir", "m", "--mode", "cross_lingual", "--text", "x", "--out", "x.wav",
                     "--dtype", "auto"]).dtype == "auto"

    def backend(*argv: str) -> str:
        args, extra = backend_args(["--model_dir", "m", "--no_api_key", *argv])
        cmd, _ = vllm_command(args, Path("export"), "name", False, extra)
        return cmd[cmd.index("--dtype") + 1]

    assert backend() == "float32" and backend("--dtype", "bfloat16") == "bfloat16"
    assert backend("--dtype", "auto") == auto_dtype("cpu", "backend")[0]
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # a CPU without the units
    assert backend("--dtype", "auto") == "float32"


def test_engine_with_auto_takes_each_role_s_pick(tiny_model_dir, monkeypatch):
    # this CPU as it is; one with AVX512-BF16 but no AMX (where the roles differ); one without bf16 units
    for cap in ("", "AVX512_CORE_BF16", "AVX512_CORE"):
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
        engine = Engine.from_model_dir(tiny_model_dir, dtype="auto")
        lm, flow = engine.lm.dtype, next(engine.t2w.flow.decoder.estimator.parameters()).dtype
        assert (lm, flow) == (resolve_dtype("auto", "cpu", "lm"), resolve_dtype("auto", "cpu", "flow"))
        if cap == "AVX512_CORE_BF16" and cpu_bf16_units():
            assert (lm, flow) == (torch.bfloat16, torch.float32)
        if cap == "AVX512_CORE":
            assert (lm, flow) == (torch.float32, torch.float32)


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


# ---------------------------------------------------------------- the embedded LM in bfloat16

def _lm_prompt(lm: SpeechLM) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return lm.prompt_embeds(torch.randint(0, 151663, (12,), generator=g).tolist(),
                            torch.randint(0, 151663, (6,), generator=g).tolist(),
                            torch.randint(0, 6561, (25,), generator=g).tolist())


def _set_packed(lm: SpeechLM, packed: list) -> list:
    linears = [m for m in lm.modules() if isinstance(m, Linear)]
    before = [m._packed for m in linears]
    for m, p in zip(linears, packed):
        m._packed = p
    return before


def test_bfloat16_lm_packs_its_weights_and_keeps_a_float32_head(tiny_model_dir):
    """In bfloat16 on the CPU the backbone's linear layers run on oneDNN-prepacked weights where the CPU has
    bf16 units; the head (llm_decoder) stays the file's float32, so the logits are not bf16 values. Packed
    and plain bf16 give the same distribution within bf16 rounding, both near float32's."""
    from cosy.model.files import ModelDir
    lm = SpeechLM.from_model_dir(tiny_model_dir, dtype=torch.bfloat16)
    sd = ModelDir(tiny_model_dir).state_dict("llm.pt")
    assert lm.dtype == torch.bfloat16 and lm.llm_decoder.weight.dtype == torch.float32
    assert torch.equal(lm.llm_decoder.weight, sd["llm_decoder.weight"])
    backbone = [m for m in lm.modules() if isinstance(m, Linear) and m is not lm.llm_decoder]
    assert {m.weight.dtype for m in backbone} == {torch.bfloat16}
    if cpu_bf16_units() is not None:
        assert all(m._packed is not None for m in backbone) and "prepacked" in lm.kernels, lm.kernels
    else:
        assert all(m._packed is None for m in backbone) and lm.kernels == "plain weights"
    prompt = _lm_prompt(lm)
    logits, h = lm._step(prompt, *lm._start(prompt, 1))
    assert logits.dtype == torch.float32 and h.dtype == torch.bfloat16
    assert torch.equal(logits, F.linear(h.float(), sd["llm_decoder.weight"], sd["llm_decoder.bias"]))
    assert (logits.bfloat16().float() != logits).float().mean() > 0.9  # not rounded to bf16

    tokens = list(range(100, 140))
    packed, _ = lm.teacher_forced_logprobs(prompt, tokens)
    kept = _set_packed(lm, [None] * 999)
    plain, _ = lm.teacher_forced_logprobs(prompt, tokens)
    _set_packed(lm, kept)
    ref, _ = SpeechLM.from_model_dir(tiny_model_dir).teacher_forced_logprobs(prompt, tokens)
    p, q, r = packed.exp(), plain.exp(), ref.exp()
    # measured on the tiny model (max |dp|): packed vs plain 0 (the same fp32 accumulation), either vs float32 0.005
    assert (p - q).abs().max() < 0.02 and (p - r).abs().max() < 0.02 and (q - r).abs().max() < 0.02


def test_a_packed_weight_changed_since_is_not_used():
    lin = Linear(64, 96).bfloat16()
    x = torch.randn(3, 1, 64).bfloat16()
    with torch.inference_mode():
        if not lin.pack():
            pytest.skip("this CPU's oneDNN has no bfloat16 linear to pack for")
        assert lin(x).shape == (3, 1, 96)
        assert (lin(x).float() - F.linear(x, lin.weight, lin.bias).float()).abs().max() < 0.05
        lin.weight.mul_(2)  # in place: the packed copy is stale
        assert torch.equal(lin(x), F.linear(x, lin.weight, lin.bias))
    assert lin(x).requires_grad  # autograd: plain F.linear


@torch.inference_mode()
def test_bfloat16_batched_decode_step_is_each_rows_solo_step(tiny_model_dir):
    """`--lm_batch` in bfloat16 (packed weights take the (B, 1, H) rows): each row's hidden state within bf16
    rounding of its solo step's, one row alone the solo arithmetic exactly."""
    from cosy.lm.decode_batch import decode_step
    lm = SpeechLM.from_model_dir(tiny_model_dir, dtype=torch.bfloat16)
    embeds = [lm.prompt_embeds(list(range(5, 9 + 3 * i)), [], list(range(10, 14 + 2 * i))) for i in range(3)]
    solo, states = [], []
    for e in embeds:
        cache, rope = lm._start(e, 4)
        lm._step(e, cache, rope)
        solo.append(lm._step(lm._embed_speech(7), cache, rope)[1])
        cache, rope = lm._start(e, 4)
        lm._step(e, cache, rope)
        states.append((cache, rope))
    h = decode_step(lm.llm.model.model, torch.cat([lm._embed_speech(7)] * 3), [c for c, _ in states],
                    [r for _, r in states])
    for i in range(3):  # measured: equal here (max |h| 2.6, whose bf16 rounding is 8e-3)
        assert h[i, 0].dtype == torch.bfloat16 and (h[i, 0].float() - solo[i].float()).abs().max() < 0.05
    cache, rope = lm._start(embeds[0], 4)
    lm._step(embeds[0], cache, rope)
    assert torch.equal(decode_step(lm.llm.model.model, lm._embed_speech(7), [cache], [rope])[0, 0], solo[0])
    logits = lm.logits(h[:, -1])
    assert logits.dtype == torch.float32 and logits.shape == (3, lm.cfg.num_speech_rows)


# ---------------------------------------------------------------- the batched flow in bfloat16

def test_bfloat16_batched_flow_is_each_rows_solo_flow(tiny_model_dir):
    """The worker's flow batches (`--flow_batch`) in bfloat16: whole utterances as one padded batch and
    streaming chunks of one saved voice at one place (incremental flow, states continued) equal each row
    alone within bf16 rounding, and stay near float32's."""
    from cosy.flow import incremental
    prompt, tokens = _prompt_and_tokens()
    flows = {dt: load_flow(tiny_model_dir, dtype=dt) for dt in (torch.float32, torch.bfloat16)}
    flow = flows[torch.bfloat16]
    rows = [(tokens[:, :60], prompt.tokens, prompt.mel, prompt.embedding),
            (tokens[:, 5:22], prompt.tokens[:, :7], prompt.mel[:, :14], prompt.embedding + 0.1),
            (tokens[:, :41], prompt.tokens[:, 3:], prompt.mel[:, 6:], prompt.embedding)]
    with torch.inference_mode():
        solo = [flow.inference(*r, streaming=False, finalize=True) for r in rows]
        ref = [flows[torch.float32].inference(*r, streaming=False, finalize=True) for r in rows]
        got = flow.inference_batch(rows)
    for a, b, r in zip(got, solo, ref):
        assert a.dtype == torch.float32 and a.shape == b.shape
        # measured: batch vs solo 0.015, bf16 vs fp32 0.019 (max |mel| 4.3)
        assert (a - b).abs().max() < 0.05 and (a - r).abs().max() < 0.1
    conds = [flow.conditions(torch.roll(tokens, 7 * i, 1), prompt.tokens, prompt.mel, prompt.embedding,
                             streaming=True, finalize=False) for i in range(3)]
    frames = conds[0][0].size(2)
    _, base = incremental.sample_new(flow, *conds[0], None, stop=20)
    solo = [incremental.sample_new(flow, *c, base, stop=frames - 20) for c in conds]
    batched = incremental.sample_new_rows(flow, [(*c, base) for c in conds], stop=frames - 20)
    for (mel_s, st_s), (mel_b, st_b), c in zip(solo, batched, conds):
        # measured: equal here (the rows' chunk products did not change blocking)
        assert mel_b.dtype == torch.float32 and mel_b.shape == mel_s.shape and (mel_b - mel_s).abs().max() < 0.05
        nxt_s, _ = incremental.sample_new(flow, *c, st_s)
        nxt_b, _ = incremental.sample_new(flow, *c, st_b)
        assert (nxt_s - nxt_b).abs().max() < 0.05
