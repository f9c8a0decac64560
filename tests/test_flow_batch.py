"""Batched, masked flow inference: a padded batch of whole utterances equals each solo `inference`."""
from __future__ import annotations

import pytest
import torch
from conftest import GOLDEN
from safetensors.torch import load_file
from test_flow import load_golden_model

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")

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

    s, gate, gated, calls = SpeechScheduler(max_frames=300, max_rows=8), threading.Event(), threading.Event(), []

    def batch_fn(args):
        calls.append(list(args))
        if "boom" in args:
            raise ValueError("boom")
        return [a * 2 for a in args]

    def submit(r, first, arg, frames, out):
        s.bind(r)
        try:
            out[r.id] = s.run(first, lambda: (gated.set(), gate.wait())[1] if arg == "gate" else _solo(arg),
                              batch=None if arg == "gate" else Batch(batch_fn, arg, frames))
        except Exception as e:
            out[r.id] = e

    def _solo(arg):
        if arg == "boom":
            raise ValueError("boom")
        return arg * 2

    def wave(specs):
        """`specs` queued while the runner is held by a gate item, then released at once. Waits on the
        scheduler's state, not fixed sleeps (under load a thread may take longer than any sleep to queue)."""
        out = {}
        held = threading.Thread(target=submit, args=(LiveRequest(99, "s", {}), True, "gate", 0, out))
        held.start()
        assert gated.wait(5)  # the runner is inside the gate item
        ts = [threading.Thread(target=submit, args=(LiveRequest(i, "s", {}, arrival=float(i)), first, a, f, out))
              for i, (first, a, f) in enumerate(specs)]
        for t in ts:
            t.start()
        deadline = time.monotonic() + 5
        while s.pending() < len(specs):  # every item queued behind the gate
            assert time.monotonic() < deadline, s.pending()
            time.sleep(0.005)
        gated.clear()
        gate.set()
        for t in (held, *ts):
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


def test_streaming_chunks_at_one_place_batch_equal_solo_and_states_continue():
    """Three requests' chunks continuing the same state place (prompt state, then a first chunk each) run
    as one batch: mel and state of every row equal its solo `sample_new`; the batched states then continue
    solo exactly as the solo states do; rows at different places are refused."""
    import pytest

    from cosy.flow import incremental

    model = load_golden_model()
    t = load_file(GOLDEN / "cases.safetensors")
    tok, ptok, pfeat, emb = t["flow.token"], t["flow.prompt_token"], t["flow.prompt_feat"], t["flow.embedding"]
    g = torch.Generator().manual_seed(1)
    rows = []
    for i in range(3):  # same prompt (a saved voice), different target tokens
        target = torch.roll(tok, shifts=7 * i, dims=1)
        rows.append(model.conditions(target, ptok, pfeat, emb + 0.05 * i * torch.randn(emb.shape, generator=g),
                                     streaming=True, finalize=False))
    frames = rows[0][0].size(2)
    _, base = incremental.sample_new(model, *rows[0], None, stop=20)  # the shared prompt state (20 frames)
    solo = [incremental.sample_new(model, *r, base, stop=frames - 20) for r in rows]
    batched = incremental.sample_new_rows(model, [(*r, base) for r in rows], stop=frames - 20)
    for (mel_s, st_s), (mel_b, st_b), r in zip(solo, batched, rows):
        assert mel_b.shape == mel_s.shape and (mel_b - mel_s).abs().max() < 1e-5
        assert st_b.frames == st_s.frames and st_b.nbytes == st_s.nbytes
        for a, b in zip(st_s.steps, st_b.steps):
            assert a.keys() == b.keys() and all((a[k] - b[k]).abs().max() < 1e-5 for k in a)
        nxt_s, _ = incremental.sample_new(model, *r, st_s)
        nxt_b, _ = incremental.sample_new(model, *r, st_b)
        assert (nxt_s - nxt_b).abs().max() < 1e-5
    with pytest.raises(ValueError, match="same stop"):
        incremental.sample_new_rows(model, [(*rows[0], base), (*rows[1], None)], stop=frames - 20)


def test_hift_rows_of_equal_length_batch_equal_solo_with_their_own_randomness():
    from cosy.model.load import load_hift

    hift = load_hift(GOLDEN / "model")
    g = torch.Generator().manual_seed(2)
    mels = [0.5 * torch.randn(1, 80, 40, generator=g) - 5 for _ in range(3)]
    caches = [None, torch.randn(1, 1, 3840, generator=g) * 0.1, torch.randn(1, 1, 3840, generator=g) * 0.1]
    solo = [hift.inference(m, cache_source=c, generator=torch.Generator().manual_seed(i))
            for i, (m, c) in enumerate(zip(mels, caches))]
    speech, source = hift.inference_rows(torch.cat(mels), caches,
                                         [torch.Generator().manual_seed(i) for i in range(3)])
    for i, (s, src) in enumerate(solo):
        # the contract: audio within 1e-4 (the batch rounds f0 differently, and the source integrates it)
        assert (speech[i:i + 1] - s).abs().max() < 1e-4 and (source[i:i + 1] - src).abs().max() < 1e-3
    # a different generator gives other audio: the rows really take their own randomness
    other, _ = hift.inference_rows(mels[0], [None], [torch.Generator().manual_seed(9)])
    assert (other - solo[0][0]).abs().max() > 1e-4
