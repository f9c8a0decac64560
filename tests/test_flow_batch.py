"""Batched, masked flow inference: a padded batch of whole utterances equals each solo `inference`."""
from __future__ import annotations

import torch
from conftest import GOLDEN
from safetensors.torch import load_file
from test_flow import load_golden_model

ATOL = 1e-5


def test_padded_batch_equals_solo():
    model = load_golden_model()
    t = load_file(GOLDEN / "cases.safetensors")
    tok, ptok, pfeat, emb = t["flow.token"], t["flow.prompt_token"], t["flow.prompt_feat"], t["flow.embedding"]
    g = torch.Generator().manual_seed(0)
    emb2 = emb + 0.1 * torch.randn(emb.shape, generator=g)
    # different prompt and target lengths (prompt mel = 2 x prompt tokens), and different speakers
    rows = [(tok[:, :60], ptok, pfeat, emb),
            (tok[:, 5:22], ptok[:, :7], pfeat[:, :14], emb2),
            (tok[:, :41], ptok[:, 3:], pfeat[:, 6:], emb)]
    solo = [model.inference(*r, streaming=False, finalize=True) for r in rows]
    got = model.inference_batch(rows)
    for a, b in zip(got, solo):
        assert a.shape == b.shape
        assert (a - b).abs().max() < ATOL
    # the batch order does not matter either
    got = model.inference_batch(rows[::-1])
    for a, b in zip(got, solo[::-1]):
        assert (a - b).abs().max() < ATOL
