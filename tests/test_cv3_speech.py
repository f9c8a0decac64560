"""CosyVoice3's speech half (DiT flow, causal HiFT, streaming token2wav) against the official outputs.

The golden directory (`fixtures/golden-cv3`, written by the official code) is loaded with our loaders and
its flow, HiFT and token2wav cases must pass within the README's tolerances; the random-model builder
writes the published key/shape layout.
"""
from __future__ import annotations

import io
import re

import pytest
import torch
import torch.nn.functional as F
from conftest import FIXTURES, STATE_DICT_LIST_CV3, reference_entries
from safetensors.torch import load_file

from cosy.hift.noise_tables import NoiseTables, state_before_source
from cosy.hift.weights import to_legacy_names
from cosy.model.config import read_model_config
from cosy.model.families.cosyvoice3 import FAMILY as CV3
from cosy.model.files import ModelDir, load_strict
from cosy.model.load import load_flow, load_hift
from cosy.pipeline.stream_vocoder import CausalStreamVocoder
from cosy.pipeline.token2wav import FlowPrompt, load_token2wav
from cosy.verify.golden_check import run
from cosy.verify.random_model.cosyvoice3_speech import write_flow_hift, yaml_text

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")

GOLDEN_CV3 = FIXTURES / "golden-cv3"
KINDS = {"flow", "hift", "token2wav"}


@pytest.fixture(scope="module")
def model_dir() -> ModelDir:
    return ModelDir(GOLDEN_CV3 / "model")


@pytest.fixture(scope="module")
def tensors() -> dict[str, torch.Tensor]:
    return load_file(GOLDEN_CV3 / "cases.safetensors")


def test_golden_flow_hift_token2wav_cases(model_dir):
    """Every flow, HiFT and token2wav case of the official CosyVoice3 fixtures, within its tolerance."""
    import json

    out = io.StringIO()
    ok = run(GOLDEN_CV3, KINDS, out=out)
    rows = [line for line in out.getvalue().splitlines() if line.strip()]
    assert ok, out.getvalue()
    cases = [c["name"] for c in json.loads((GOLDEN_CV3 / "cases.json").read_text())["cases"]
             if c["name"].split(".")[0] in KINDS]
    assert len(cases) == 12
    labels = [re.split(r"\s{2,}", row.strip())[0] for row in rows]
    for name in cases:  # every case reported, none skipped
        assert any(label == name or label.startswith(name + ".") or label.startswith(name + "[")
                   or label.startswith(name + " (") for label in labels), name
    for row in rows:
        label, diff, tol, result = row.rsplit(None, 3)
        assert result == "PASS" and float(diff) <= float(tol), row
    text = out.getvalue()
    assert "hift.noise_tables (14/14 exact)" in text  # replayed states (tiny + published size), whole tables
    assert "token2wav.stream.chunks[2]" in text and "token2wav.stream.token2wav_calls" in text


def test_hift_weight_norm_names(model_dir):
    """hift.pt with legacy weight_g/weight_v names and a `generator.` prefix loads to the same weights; the
    f0 predictor keeps float64 weights (the official runs it in float64)."""
    hift = load_hift(model_dir)
    legacy = {"generator." + k: v for k, v in to_legacy_names(model_dir.state_dict("hift.pt")).items()}
    assert any(k.endswith(".weight_g") for k in legacy)
    other = type(hift)(model_dir.config.hift)
    load_strict(other, other.fold_checkpoint(legacy), "legacy hift.pt")
    a, b = hift.state_dict(), other.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert hift.f0_predictor.condnet[0].weight.dtype == torch.float64
    assert hift.conv_pre.weight.dtype == torch.float32


def test_noise_tables_drawn_on_demand(model_dir):
    cfg = model_dir.config.hift
    state = state_before_source(cfg)
    short, long = NoiseTables(state, 9, 7_200_000), NoiseTables(state, 9, 7_200_000)
    assert torch.equal(short.sine_waves(1000), long.sine_waves(300_000)[:, :1000])
    assert torch.equal(short.sine_waves(300_000), long.sine_waves(300_000))  # grown: still the same table
    with pytest.raises(ValueError, match="300 s"):
        short.sine_waves(7_200_001)


def test_streaming_with_speed_revocodes_the_stretched_mel(model_dir, tensors):
    """Streaming at speed 1.25: the chunks join into the causal vocoder's output on the stretched
    streaming mel (the official chunk schedule, mel stretched as non-streaming speed does)."""
    t2w = load_token2wav(model_dir)
    assert t2w.stream_vocoder is CausalStreamVocoder
    tokens = tensors["flow.token"]
    prompt = FlowPrompt(tensors["flow.prompt_token"], tensors["flow.prompt_feat"], tensors["flow.embedding"])
    stream = t2w.stream(prompt, speed=1.25)
    chunks = []
    for i in range(0, 100, 7):  # tokens arrive in pieces, as from the LM
        chunks += stream.push(tokens[0, i:i + 7].tolist())
    chunks.append(stream.finish())
    assert len(chunks) == 3 and all(c.numel() > 0 for c in chunks)

    p = (prompt.tokens, prompt.mel, prompt.embedding)
    mel = torch.cat([t2w.flow.inference(tokens[:, :33], *p, streaming=True, finalize=False),
                     t2w.flow.inference(tokens[:, :83], *p, streaming=True, finalize=False)[:, :, 60:],
                     t2w.flow.inference(tokens, *p, streaming=False, finalize=True)[:, :, 160:]], dim=2)
    stretched = F.interpolate(mel, size=int(200 / 1.25), mode="linear")
    expected, _ = t2w.hift.inference(stretched, finalize=True)
    speech = torch.cat(chunks)
    assert speech.shape == (160 * 480,)
    assert (speech - expected[0]).abs().max() < 1e-3


def test_dit_flow_padded_batch_equals_solo(model_dir, tensors):
    """Whole utterances of different lengths, prompts and speakers in one padded DiT batch: each row equals
    its solo call to float rounding (1e-5 on the mel, the speech engine's rule)."""
    flow = load_flow(model_dir)
    assert flow.supports_batch()
    tok, pt, pf, emb = (tensors[k] for k in ("flow.token", "flow.prompt_token", "flow.prompt_feat", "flow.embedding"))
    rows = [(tok[:, :40], pt, pf, emb), (tok, pt[:, :12], pf[:, :24], torch.randn(1, 192)), (tok[:, 5:60], pt, pf, emb)]
    for mine, row in zip(flow.inference_batch(rows), rows):
        solo = flow.inference(*row, streaming=False, finalize=True)
        assert mine.shape == solo.shape and (mine - solo).abs().max() < 1e-5


def test_random_full_size_flow_hift_match_the_published_layout(tmp_path):
    """Our builder's full-size flow.pt / hift.pt: the published keys (in order), shapes and dtypes, and they
    load strictly into our modules."""
    family = CV3
    (tmp_path / family.files.yaml).write_text(yaml_text("full", llm_size=896))
    cfg = read_model_config(tmp_path / family.files.yaml, family)
    write_flow_hift(tmp_path, cfg, seed=0)
    md = ModelDir(tmp_path)
    for section, name in (("flow", "flow.pt"), ("hift", "hift.pt")):
        sd = md.state_dict(name)
        got = [(k, tuple(v.shape), str(v.dtype)) for k, v in sd.items()]
        assert got == reference_entries(section, STATE_DICT_LIST_CV3), name
    flow, hift = load_flow(md), load_hift(md)
    assert sum(p.numel() for p in flow.parameters()) == 332_257_088  # as published (inv_freq: a buffer)
    assert sum(p.numel() for p in hift.parameters()) < 20_779_887  # weight norm folded: no g tensors


def test_random_tiny_model_speaks(tmp_path):
    """A tiny random directory synthesises voiced audio (the f0 predictor was made to say 'voiced')."""
    family = CV3
    (tmp_path / family.files.yaml).write_text(yaml_text("tiny", llm_size=64))
    write_flow_hift(tmp_path, read_model_config(tmp_path / family.files.yaml, family), seed=3)
    t2w = load_token2wav(tmp_path)
    g = torch.Generator().manual_seed(0)
    prompt = FlowPrompt(torch.randint(0, 6561, (1, 12), generator=g), torch.randn(1, 24, 80, generator=g) - 5,
                        torch.randn(1, 192, generator=g))
    wav = t2w(torch.randint(0, 6561, (1, 30), generator=g), prompt)
    assert wav.shape == (60 * 480,) and wav.abs().max() > 0
    f0 = t2w.hift.predict_f0(t2w.mel(torch.randint(0, 6561, (1, 30), generator=g), prompt))
    assert (f0 > 10).float().mean() > 0.5


def test_cached_streaming_equals_recompute(model_dir, tensors):
    """With a state budget the DiT computes only new frames (and a saved voice's final prompt chunks once):
    the same chunks as recomputing every prefix (mel to float rounding; audio within the golden tolerance,
    the tiny model's x3360 f0 classifier amplifies mel rounding)."""
    plain, cached = load_token2wav(model_dir), load_token2wav(model_dir, cache_mb=64)
    assert cached.state_budget is not None
    tokens = torch.cat([tensors["flow.prompt_token"]] * 3 + [tensors["flow.prompt_token"][:, :2]], dim=1)
    mel = torch.randn(1, 2 * tokens.shape[1], 80, generator=torch.Generator().manual_seed(5)) * 0.5 - 5
    chunks = []
    # 62-token prompt: two chunks final without target; then the same token by token as the engine pushes
    # them, the prompt's last chunk computed ahead of the first chunk
    for t2w, key, ahead in ((plain, None, False), (cached, "voice", False), (cached, "voice", True)):
        stream = t2w.stream(FlowPrompt(tokens, mel, tensors["flow.embedding"], key))
        out = []
        for i in range(0, 200, 50):
            new = tensors["flow.token"][0].tolist()[i % 100:i % 100 + 50]
            for piece in ([t] for t in new) if ahead else [new]:
                stream.add(piece)
                if ahead and stream.ahead_due():
                    stream.compute_ahead()
                    assert stream.held is not None and stream.held.shape[2] == 2 * stream.first_pad
                out += stream.push([])
        assert stream.ahead_done == ahead
        chunks.append(out + [stream.finish()])
    assert cached.state_budget.voice("voice") is not None
    assert [c.shape for c in chunks[0]] == [c.shape for c in chunks[1]] == [c.shape for c in chunks[2]]
    assert len(chunks[0]) >= 3
    assert max((a - b).abs().max() for a, b in zip(chunks[0], chunks[1])) < 1e-3
    assert max((a - b).abs().max() for a, b in zip(chunks[0], chunks[2])) < 1e-3


def test_dit_new_frames_equal_the_full_streaming_call(model_dir, tensors):
    """`incremental.sample_new` on the DiT: each streaming chunk's new frames from the state of earlier
    ones equal the full prefix recomputation (1e-5 on the mel)."""
    from cosy.flow import incremental

    flow = load_flow(model_dir)
    assert incremental.supports(flow)
    p = (tensors["flow.prompt_token"], tensors["flow.prompt_feat"], tensors["flow.embedding"])
    state, done = None, 0
    for n in (33, 83):  # the official schedule's prefixes for a 20-token prompt: frames [0, 100), [100, 200)
        tok = tensors["flow.token"][:, :n]
        mu, spks, cond = flow.conditions(tok, *p, streaming=True, finalize=False)
        new, state = incremental.sample_new(flow, mu, spks, cond, state)
        full = flow.inference(tok, *p, streaming=True, finalize=False)  # frames [40, end)
        assert new.shape[2] == state.frames - done
        assert (new[:, :, max(0, 40 - done):] - full[:, :, max(0, done - 40):]).abs().max() < 1e-5
        done = state.frames
