"""Reading cosyvoice2.yaml as data, and model-directory errors that name the file."""
from __future__ import annotations

import shutil
import sys

import pytest
import torch
from conftest import GOLDEN

from cosy.model.config import read_model_config
from cosy.model.files import ModelDir, ModelDirError
from cosy.model.hyperyaml import Tagged, load_hyperyaml

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")


def test_golden_yaml_values():
    cfg = read_model_config(GOLDEN / "model" / "cosyvoice2.yaml")
    assert (cfg.sample_rate, cfg.token_frame_rate, cfg.chunk_size) == (24000, 25, 25)
    assert (cfg.llm_input_size, cfg.speech_token_size) == (64, 6561)
    assert (cfg.sampling.top_p, cfg.sampling.top_k, cfg.sampling.win_size, cfg.sampling.tau_r) == (0.8, 25, 10, 0.1)
    f = cfg.flow
    assert (f.vocab_size, f.input_size, f.output_size, f.spk_embed_dim) == (6561, 512, 80, 192)
    assert (f.encoder.attention_heads, f.encoder.linear_units, f.encoder.num_blocks) == (2, 128, 2)
    assert f.estimator.channels == (64,) and f.estimator.num_mid_blocks == 2 and f.estimator.num_heads == 2
    assert f.estimator.static_chunk_size == 50  # `!ref <chunk_size> * <token_mel_ratio>`
    assert f.cfm.inference_cfg_rate == 0.7 and f.cfm.t_scheduler == "cosine"
    h = cfg.hift
    assert (h.base_channels, h.f0_cond_channels, h.istft_n_fft, h.istft_hop_len) == (64, 64, 16, 4)
    assert h.upsample_rates == (8, 5, 3) and h.resblock_dilation_sizes == ((1, 3, 5),) * 3


def test_reading_executes_nothing():
    """The official loader reseeds every RNG and imports cosyvoice; reading as data must do neither."""
    state = torch.get_rng_state()
    doc = load_hyperyaml(GOLDEN / "model" / "cosyvoice2.yaml")
    assert torch.equal(state, torch.get_rng_state())
    assert "cosyvoice" not in sys.modules and "matcha" not in sys.modules
    assert isinstance(doc["__set_seed3"], Tagged) and doc["__set_seed3"].target == "torch.manual_seed"
    assert doc["hifigan"]["generator"].target.endswith("HiFTGenerator")  # a !ref to a tagged node


def test_ref_arithmetic_and_errors(tmp_path):
    p = tmp_path / "a.yaml"
    p.write_text("a: 3\nb: !ref <a> * 4 - 2\nc: !ref <a> / 2\nn: {x: !ref <b>}\n")
    d = load_hyperyaml(p)
    assert (d["b"], d["c"], d["n"]["x"]) == (10, 1.5, 10)
    p.write_text("a: !ref <missing>\n")
    with pytest.raises(ValueError, match="a.yaml.*missing"):
        load_hyperyaml(p)
    p.write_text("a: 1\nb: !ref __import__('os') <a>\n")
    with pytest.raises(ValueError, match="not an arithmetic expression"):
        load_hyperyaml(p)
    p.write_text("a: [unclosed\n")
    with pytest.raises(ValueError, match="a.yaml: not a readable"):
        load_hyperyaml(p)


def test_wrong_model_class_is_named(tmp_path):
    text = (GOLDEN / "model" / "cosyvoice2.yaml").read_text()
    p = tmp_path / "cosyvoice2.yaml"
    p.write_text(text.replace("flow.flow.CausalMaskedDiffWithXvec", "flow.flow.MaskedDiffWithXvec"))
    with pytest.raises(ValueError, match="'flow' should be a !new:...CausalMaskedDiffWithXvec"):
        read_model_config(p)


def test_missing_and_corrupt_files_are_named(tmp_path):
    with pytest.raises(ModelDirError, match="does not exist"):
        ModelDir(tmp_path / "nope")
    d = tmp_path / "m"
    shutil.copytree(GOLDEN / "model", d)
    md = ModelDir(d)
    assert md.missing() == ["campplus.onnx", "speech_tokenizer_v2.onnx"]
    with pytest.raises(ModelDirError, match="campplus.onnx is missing"):
        md.file("campplus.onnx")
    (d / "flow.pt").write_bytes((d / "flow.pt").read_bytes()[:1000])  # truncated download
    with pytest.raises(ModelDirError, match="flow.pt is corrupt"):
        md.state_dict("flow.pt")
    (d / "hift.pt").write_text("not a checkpoint")
    with pytest.raises(ModelDirError, match="hift.pt is corrupt"):
        md.state_dict("hift.pt")
