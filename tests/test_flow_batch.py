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


def test_scheduler_batches_due_items_within_budget_and_isolates_failures():
    import threading
    import time

    from cosy.speech.request import LiveRequest
    from cosy.speech.scheduler import Batch, SpeechScheduler

    s, gate, calls = SpeechScheduler(max_frames=300, max_rows=8), threading.Event(), []

    def batch_fn(args):
        calls.append(list(args))
        if "boom" in args:
            raise ValueError("boom")
        return [a * 2 for a in args]

    def submit(r, first, arg, frames, out):
        s.bind(r)
        try:
            out[r.id] = s.run(first, lambda: gate.wait() if arg == "gate" else _solo(arg),
                              batch=None if arg == "gate" else Batch(batch_fn, arg, frames))
        except Exception as e:
            out[r.id] = e

    def _solo(arg):
        if arg == "boom":
            raise ValueError("boom")
        return arg * 2

    def wave(specs):
        out = {}
        threading.Thread(target=submit, args=(LiveRequest(99, "s", {}), True, "gate", 0, out)).start()
        time.sleep(0.1)
        ts = [threading.Thread(target=submit, args=(LiveRequest(i, "s", {}, arrival=float(i)), first, a, f, out))
              for i, (first, a, f) in enumerate(specs)]
        for t in ts:
            t.start()
        time.sleep(0.2)
        gate.set()
        for t in ts:
            t.join(5)
        gate.clear()
        return out

    # first chunks first (2, 3), then oldest (0, 1); rows x longest <= 300 frames: 3 rows of 100 fit, a 4th not
    out = wave([(False, 1, 100), (False, 2, 100), (True, 3, 100), (True, 4, 50)])
    assert calls == [[3, 4, 1]]  # the one left over runs alone (its fn)
    assert out == {0: 2, 1: 4, 2: 6, 3: 8, 99: True}
    calls.clear()
    out = wave([(True, 5, 50), (True, "boom", 50), (True, 7, 50)])  # a failing row fails alone
    assert calls == [[5, "boom", 7]]
    assert out[0] == 10 and out[2] == 14 and isinstance(out[1], ValueError)
