"""The batch-wide RAS logits processor (`CosyLogitsProcessor.apply`, `cosy.lm.ras_batch`) against the former
row-by-row one (`apply_rows`, `ras_logprobs`) and the exact distribution (`ras_distribution`)."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from cosy.lm import SamplingParams, ras_distribution
from cosy.lm.ras_batch import ras_logprobs_batch
from cosy.model.families.cosyvoice2 import FAMILY as CV2

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")

TOKENS = CV2.tokens
V = TOKENS.vocab
NORMAL = -87.33  # log of float32's smallest normal: below, the official float32 softmax gives subnormals


def _vllm():
    from cosy.vllm_plugin import hide_torch_addons

    hide_torch_addons()
    pytest.importorskip("vllm")
    from vllm import SamplingParams as VllmParams
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    from cosy.vllm_plugin.ras import CosyLogitsProcessor
    return CosyLogitsProcessor, VllmParams, BatchUpdate, MoveDirectionality


def _processor(device="cpu"):
    cls, *rest = _vllm()
    config = SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace(cosy_family=CV2.name)))
    return cls(config, torch.device(device), False), *rest


def assert_same_rows(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal within float rounding: -inf at the same places, log-probs within 2e-5 where the probability is
    a normal float32, probabilities within 1e-30 below (the official subnormals are coarse)."""
    assert torch.equal(torch.isneginf(a), torch.isneginf(b))
    assert not a.isnan().any()
    normal = b > NORMAL
    torch.testing.assert_close(a[normal], b[normal], atol=2e-5, rtol=1e-6)
    assert (a[~normal].double().exp() - b[~normal].double().exp()).abs().max().item() < 1e-30 if (~normal).any() \
        else True


def _random_args(rng: random.Random) -> dict:
    kind = rng.random()
    if kind < 0.15:
        return {}
    if kind < 0.3:
        return {"cosy_min_len": rng.randint(0, 20), "cosy_ignore_stop": rng.randint(0, 1)}
    return {"cosy_ras": 1, "cosy_min_len": rng.randint(0, 20), "cosy_ignore_stop": rng.randint(0, 1),
            "cosy_top_p": rng.choice([0.8, 0.5, 1.0, 0.95, 0.3]), "cosy_top_k": rng.choice([1, 5, 25, 25, 40, 300]),
            "cosy_win": rng.choice([0, 1, 3, 10, 10]), "cosy_tau": rng.choice([0.0, 0.1, 0.1, 0.34, 1.0])}


@pytest.mark.parametrize("batch", [1, 2, 3, 5, 8, 16, 33, 64])
@pytest.mark.parametrize("device_path", [False, True])
def test_batch_equals_row_by_row(batch, device_path, monkeypatch):
    """device_path: the code that GPUs run (every row through the redraw terms, no host branch)."""
    monkeypatch.setattr("cosy.lm.ras_batch.CPU_SUBSET", not device_path)
    proc, VllmParams, BatchUpdate, Move = _processor()
    rng = random.Random(batch)
    gen = torch.Generator().manual_seed(batch)
    scale = torch.tensor([rng.choice([0.5, 1, 3, 8, 30, 100]) for _ in range(batch)])[:, None]
    logits = torch.randn(batch, V, generator=gen) * scale
    logits[:, 3000:3100] = float("-inf")  # -inf logits stay -inf
    if batch > 2:
        logits[1, :] = float("-inf")
        logits[1, 7] = 0.0  # one finite logit: its repeat redraw gives it again
    outs, added = [], []
    for i in range(batch):
        top = logits[i].argsort(descending=True)[:6].tolist()
        out = [rng.choice(top + [1, 2]) for _ in range(rng.randint(0, 14))]
        args = _random_args(rng)
        if i == 1:
            args = {"cosy_ras": 1, "cosy_win": 3, "cosy_tau": 0.1}
            out = [7]
        outs.append(out)
        added.append((i, VllmParams(extra_args=args) if args else VllmParams(temperature=0.7), None, out))
    proc.update_state(BatchUpdate(batch, [], added, []))
    rows = list(range(batch))  # batch row -> request
    for step in range(6):
        x = logits[rows]
        assert_same_rows(proc.apply(x.clone()), proc.apply_rows(x.clone()))
        for r in rows:  # vLLM appends to the live lists
            top = logits[r].argsort(descending=True)[:4].tolist()
            outs[r].append(rng.choice(top))
        if step == 2 and batch >= 3:  # the last leaves, 0 and 1 swap, a new request takes the last row
            n = len(rows) - 1
            rows = [rows[1], rows[0], *rows[2:n]]
            proc.update_state(BatchUpdate(n, [n], [], [(0, 1, Move.SWAP)]))
        elif step == 4 and batch >= 3:
            new = [rng.choice([1, 2, 3]) for _ in range(20)]
            outs.append(new)
            logits = torch.cat([logits, torch.randn(1, V, generator=gen) * 3])
            rows = [*rows, len(outs) - 1]
            args = {"cosy_ras": 1, "cosy_top_k": 25, "cosy_win": 10, "cosy_tau": 0.1}
            proc.update_state(BatchUpdate(len(rows), [], [(len(rows) - 1, VllmParams(extra_args=args), None, new)],
                                          []))
        else:
            proc.update_state(None)


@pytest.mark.parametrize("scale", [1.0, 3.0, 30.0, 200.0])
def test_batch_function_equals_exact_distribution(scale):
    gen = torch.Generator().manual_seed(int(scale))
    logits = torch.randn(4, V, generator=gen) * scale
    params = [SamplingParams(), SamplingParams(top_p=0.95, top_k=100, win_size=5, tau_r=0.2),
              SamplingParams(top_p=1.0, top_k=3, win_size=10, tau_r=0.0), SamplingParams(win_size=0)]
    hists = [logits[i].argsort(descending=True)[:3].tolist() * 2 for i in range(4)]
    window = torch.full((4, 10), -1)
    for i, (h, p) in enumerate(zip(hists, params)):
        last = h[-p.win_size:] if p.win_size else []
        window[i, :len(last)] = torch.tensor(last, dtype=torch.int64)
    mask = torch.tensor([True, False, True, False])
    got = ras_logprobs_batch(logits, mask, torch.tensor([p.top_p for p in params]),
                             torch.tensor([p.top_k for p in params]), window,
                             torch.tensor([p.win_size * p.tau_r for p in params], dtype=torch.float64),
                             TOKENS.min_len_mask, max(p.top_k for p in params))
    for i, p in enumerate(params):
        want = ras_distribution(logits[i], hists[i], p, bool(mask[i]), tokens=TOKENS)
        assert_same_rows(got[i], want.log().float())
        torch.testing.assert_close(got[i].double().exp(), want, atol=1e-6, rtol=0)


def test_no_device_read_per_step():
    """On the meta device every host read of a tensor raises: the default parameters (top_k <= 32) need
    none, for any batch."""
    proc, VllmParams, BatchUpdate, _ = _processor("meta")
    rng = random.Random(0)
    outs = [[rng.randint(0, 6560) for _ in range(rng.randint(0, 12))] for _ in range(16)]
    args = [{"cosy_ras": 1, "cosy_min_len": 3}, {"cosy_min_len": 5, "cosy_ignore_stop": 1}, {}, {"cosy_ras": 1}]
    proc.update_state(BatchUpdate(16, [], [(i, VllmParams(extra_args=args[i % 4]), None, outs[i])
                                           for i in range(16)], []))
    for _ in range(3):
        out = proc.apply(torch.empty(16, V, device="meta"))
        assert out.device.type == "meta" and out.shape == (16, V)
        for o in outs:
            o.append(1)
        proc.update_state(None)


def test_history_slots_are_reused():
    proc, VllmParams, BatchUpdate, _ = _processor()
    ras = VllmParams(extra_args={"cosy_ras": 1})
    for k in range(40):  # requests replace each other: one slot in use
        proc.update_state(BatchUpdate(1, [], [(0, ras, None, [k])], []))  # replaces row 0
        proc.apply(torch.randn(1, V))
    assert proc.history.shape[0] == 8 and len(proc._free) == 7


def test_stable_top_equals_a_stable_sort_with_ties():
    from cosy.lm.ras_batch import _stable_top

    gen = torch.Generator().manual_seed(3)
    probs = torch.randint(0, 6, (32, 500), generator=gen).float().softmax(1)  # many exact ties
    probs[:4] = torch.rand(4, 500, generator=gen).softmax(1)
    probs[5, :] = 0.0
    probs[5, 400] = 1.0
    for k in (1, 2, 25, 100, 499, 500):
        vals, ids = _stable_top(probs, k)
        want_v, want_i = probs.sort(dim=1, descending=True, stable=True)
        assert torch.equal(vals, want_v[:, :k]) and torch.equal(ids, want_i[:, :k]), k
