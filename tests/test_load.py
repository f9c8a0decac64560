"""Loading official state dicts strictly, with errors that name the file and the keys."""
from __future__ import annotations

import shutil

import pytest
import torch
from conftest import GOLDEN, reference_shapes

from cosy.hift.weights import fold_weight_norm
from cosy.model.files import ModelDirError, empty_modules
from cosy.model.load import load_flow, load_hift


def test_mismatched_checkpoint_names_file_and_keys(tmp_path):
    d = tmp_path / "m"
    shutil.copytree(GOLDEN / "model", d)
    sd = torch.load(d / "flow.pt", weights_only=True)
    sd["extra.weight"] = torch.zeros(1)
    del sd["encoder_proj.bias"]
    sd["spk_embed_affine_layer.weight"] = torch.zeros(3, 3)
    torch.save(sd, d / "flow.pt")
    with pytest.raises(ModelDirError) as e:
        load_flow(d)
    msg = str(e.value)
    assert "flow.pt does not match cosyvoice2.yaml" in msg
    assert "missing: encoder_proj.bias" in msg and "unexpected: extra.weight" in msg
    assert "wrong shape: spk_embed_affine_layer.weight (3, 3)" in msg


def test_full_random_model_loads_strictly_with_official_keys(full_model_dir):
    flow = load_flow(full_model_dir)
    assert {k: tuple(v.shape) for k, v in flow.state_dict().items()} == reference_shapes("flow")
    assert sum(p.numel() for p in flow.parameters()) == pytest.approx(112.5e6, rel=0.01)
    hift = load_hift(full_model_dir)
    # the file holds the published (legacy weight_g / weight_v) names; folded they equal our module's keys
    raw = torch.load(full_model_dir / "hift.pt", weights_only=True)
    assert any(k.endswith(".weight_g") for k in raw) and not any("parametrizations" in k for k in raw)
    assert set(fold_weight_norm(raw)) == set(hift.state_dict())
    assert sum(p.numel() for p in hift.parameters()) == pytest.approx(20.8e6, rel=0.01)


def test_full_random_llm_has_official_keys_and_loads_strictly(full_model_dir):
    from cosy.lm.model import SpeechLM
    raw = torch.load(full_model_dir / "llm.pt", weights_only=True, mmap=True)
    assert {k: tuple(v.shape) for k, v in raw.items()} == reference_shapes("llm")
    lm = SpeechLM.from_model_dir(full_model_dir)  # strict: only the unused tied lm_head is left out
    assert sum(p.numel() for p in lm.parameters()) == pytest.approx(505.8e6, rel=0.001)  # as published
    ids = lm.prompt_embeds([100, 200, 151646], [], [1, 2, 3])
    assert ids.shape == (1, 1 + 3 + 1 + 3, 896)


def test_empty_modules_skip_init_on_this_thread_only():
    """Inside `empty_modules` parameters are meta and no nn.init function runs (a load replaces them all);
    another thread building a module at the same time gets the usual random init."""
    import threading
    inside, outside = threading.Event(), {}

    def other_thread():
        inside.wait(10)
        torch.manual_seed(0)
        outside["weight"] = torch.nn.Embedding(4, 3).weight.detach()

    t = threading.Thread(target=other_thread)
    t.start()
    with empty_modules():
        inside.set()
        t.join(10)
        emb, lin = torch.nn.Embedding(5, 2), torch.nn.Linear(2, 3)
        assert torch.nn.init.normal_(torch.zeros(2, device="cpu")).eq(0).all()  # init leaves its tensor alone
    assert emb.weight.is_meta and lin.weight.is_meta and lin.bias.is_meta
    torch.manual_seed(0)
    assert torch.equal(outside["weight"], torch.nn.Embedding(4, 3).weight.detach())
    assert outside["weight"].std() > 0.1 and torch.nn.init.normal_(torch.zeros(2)).ne(0).any()
