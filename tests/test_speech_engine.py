"""The speech-stage engine on the tiny model: many live requests in one process, each equal to its solo
run (streaming cache, scheduler, any arrival order); bad companions never disturb a request; the worker
pool holds max_batch requests per worker process."""
from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import ASSETS, assert_pool_equals_solo
from worker_hooks import cap_lm, unhurried_lm

from cosy.errors import Cancelled, JobError
from cosy.pipeline.engine import Engine, SynthesisRequest
from cosy.service.workers import EngineSpec, WorkerPool
from cosy.speech.request import LiveRequest
from cosy.speech.scheduler import SpeechScheduler

ZS_WAV = ASSETS / "zero_shot_prompt.wav"
ZS_TEXT = "希望你以后能够做的比我还好呦。"
TEXTS = ["今天天气很好。", "我们一起去公园散步，看看花草树木。", "你好。", "希望你以后能够做的比我还好呦。"]


@pytest.fixture(scope="module")
def engines(tiny_model_dir):
    old = Engine.from_model_dir(tiny_model_dir)  # today's path: recompute, batch 1, no scheduler
    new = Engine.from_model_dir(tiny_model_dir, cache_mb=256)
    for e in (old, new):
        cap_lm(e, 90)  # three streaming chunks and more; the random LM would run to 300 tokens
    new.speech_runner = SpeechScheduler().run
    return old, new


@pytest.fixture(scope="module")
def voice(engines):
    return engines[0].prompt_features(ZS_WAV)


def requests(voice) -> list[SynthesisRequest]:
    out = []
    for i in range(8):
        kw = dict(text=TEXTS[i % 4], seed=i, stream=i % 3 != 2, speed=(1.0, 0.5, 1.3, 2.0)[i % 4])
        if i % 2:
            kw.update(mode="voice", voice=voice, prompt_text=ZS_TEXT)
        else:
            kw.update(mode="zero_shot", prompt_wav=ZS_WAV, prompt_text=ZS_TEXT)
        out.append(SynthesisRequest(**kw))
    return out


def live(scheduler_run, engine, req, i, results, cancel_after=None):
    r = LiveRequest(i, "synthesize", {})
    scheduler_run.__self__.bind(r)
    chunks = []
    try:
        for c in engine.synthesize(req):
            chunks.append(c)
            if cancel_after is not None and len(chunks) >= cancel_after:
                r.cancelled.set()
        results[i] = chunks
    except Cancelled:
        results[i] = ("cancelled", chunks)
    except Exception as e:
        results[i] = e


def test_eight_concurrent_requests_equal_their_solo_runs(engines, voice):
    old, new = engines
    reqs = requests(voice)
    solo = [list(old.synthesize(r)) for r in reqs]
    order = list(range(8))
    random.Random(3).shuffle(order)
    results, threads = {}, []
    for i in order:
        threads.append(threading.Thread(target=live, args=(new.speech_runner, new, reqs[i], i, results)))
        threads[-1].start()
        time.sleep(random.Random(i).random() * 0.05)
    for t in threads:
        t.join(120)
    for i in range(8):
        got = results[i]
        assert len(got) == len(solo[i]) and len(got) >= 1, i
        for a, b in zip(got, solo[i]):
            assert a.shape == b.shape and (a - b).abs().max() < 1e-4, i
    assert new.t2w.state_budget.used() == new.t2w.state_budget._voice_bytes  # streams released their state
    print("batched steps (rows):", new.speech_runner.__self__.batches)


def test_batched_flows_and_hift_steps_equal_their_solo_runs(engines, voice):
    old, new = engines
    reqs = [SynthesisRequest(mode="voice", voice=voice, prompt_text=ZS_TEXT, text=TEXTS[i % 4], seed=i,
                             stream=i % 2 == 1) for i in range(6)]
    solo = [list(old.synthesize(r)) for r in reqs]
    batching, gate = SpeechScheduler(max_rows=8), threading.Event()

    def hold():  # keeps the runner busy until every request has queued its work
        batching.bind(LiveRequest(99, "synthesize", {}))
        batching.run(True, gate.wait)

    threading.Thread(target=hold).start()
    engine_runner, new.speech_runner = new.speech_runner, batching.run
    results, threads = {}, []
    for i, req in enumerate(reqs):
        threads.append(threading.Thread(target=live, args=(batching.run, new, req, i, results)))
        threads[-1].start()
    deadline = time.monotonic() + 60
    while batching.pending() < 6 and time.monotonic() < deadline:
        time.sleep(0.05)
    gate.set()
    for t in threads:
        t.join(120)
    new.speech_runner = engine_runner
    for i in range(6):
        assert len(results[i]) == len(solo[i]), i
        for a, b in zip(results[i], solo[i]):
            assert a.shape == b.shape and (a - b).abs().max() < 1e-4, i
    rows = {}
    for name, n in batching.batches:
        rows[name] = max(rows.get(name, 0), n)
    assert rows.get("run_jobs", 0) >= 3, batching.batches  # whole flows ran batched
    assert rows.get("run_chunks", 0) >= 2, batching.batches  # streamed chunks of the voice at one place
    assert rows.get("run_vocode", 0) >= 2, batching.batches  # and their HiFT steps


def test_bad_companions_never_disturb_a_request(engines, voice, tmp_path):
    old, new = engines
    good = SynthesisRequest(mode="voice", voice=voice, prompt_text=ZS_TEXT, text=TEXTS[1], seed=7, stream=True)
    want = list(old.synthesize(good))
    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x00\x00\x00\x00WAVEfmt garbage")
    bad = [SynthesisRequest(mode="zero_shot", prompt_wav=corrupt, prompt_text=ZS_TEXT, text=TEXTS[0]),
           SynthesisRequest(mode="voice", voice=voice, prompt_text=ZS_TEXT, text="好" * 100_000),
           SynthesisRequest(mode="voice", voice=voice, prompt_text=ZS_TEXT, text=TEXTS[1] * 2, stream=True)]
    results, threads = {}, []
    batching = SpeechScheduler(max_rows=8)  # companions may share batched steps with the good request
    engine_runner, new.speech_runner = new.speech_runner, batching.run
    try:
        for i, req in enumerate([good] + bad):
            cancel = 1 if i == 3 else None
            threads.append(threading.Thread(target=live, args=(batching.run, new, req, i, results, cancel)))
            threads[-1].start()
        for t in threads:
            t.join(120)
    finally:
        new.speech_runner = engine_runner
    assert len(results[0]) == len(want)
    for a, b in zip(results[0], want):
        assert (a - b).abs().max() < 1e-4
    assert isinstance(results[1], Exception) and isinstance(results[2], Exception)
    assert results[3][0] == "cancelled" and len(results[3][1]) == 1  # stopped at once, mid-request


def test_scheduler_first_chunks_first_then_oldest():
    s, gate, order = SpeechScheduler(), threading.Event(), []

    def submit(r, first, name, fn=None):
        s.bind(r)
        s.run(first, fn or (lambda: order.append(name)))

    threading.Thread(target=submit, args=(LiveRequest(0, "synthesize", {}), True, "", gate.wait)).start()
    time.sleep(0.1)  # the runner is busy: the next items queue up
    r1, r2, r3 = (LiveRequest(i, "synthesize", {}, arrival=float(i)) for i in (1, 2, 3))
    threads = [threading.Thread(target=submit, args=a)
               for a in ((r3, False, "later-3"), (r2, True, "first-2"), (r1, False, "later-1"), (r3, True, "first-3"))]
    for t in threads:
        t.start()
    time.sleep(0.2)
    gate.set()
    for t in threads:
        t.join(5)
    assert order == ["first-2", "first-3", "later-1", "later-3"]


def test_pool_holds_max_batch_requests_per_worker(tiny_model_dir):
    # 90 tokens a request (three streaming chunks; the random LM would make 800 for the text this test had),
    # slowly enough that all four are still running when the last one's first chunk arrives
    pool = WorkerPool(EngineSpec(str(tiny_model_dir), max_batch=4, cache_mb=64, fixed_tokens=90), workers=1,
                      max_queue=4)  # asked for at once, all four may wait a moment before the worker takes them
    pool.worker_prepare = unhurried_lm
    pool.start()
    try:
        req = SynthesisRequest(mode="zero_shot", text=TEXTS[1], prompt_text=ZS_TEXT, prompt_wav=str(ZS_WAV),
                               seed=1, stream=True)
        gens = [pool.synthesize(req) for _ in range(4)]
        with ThreadPoolExecutor(4) as asking:  # all four asked for at once (a generator submits at its first next)
            firsts = list(asking.map(next, gens))  # and served at once by the one worker
        assert all(isinstance(f, np.ndarray) and f.size for f in firsts)
        assert pool.stats()["busy"] == 4 and pool.stats()["capacity"] == 4
        gens[0].close()  # cancel: the slot frees at once
        deadline = time.monotonic() + 5
        while pool.stats()["busy"] != 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert pool.stats()["busy"] == 3
        for g in gens[1:]:
            assert sum(c.size for c in g) > 0
        with pytest.raises(JobError):
            list(pool.synthesize(SynthesisRequest(mode="voice", text="x")))
    finally:
        pool.close()


def test_flow_batch_flag_defaults_per_device_and_a_batching_pool_equals_solo(tiny_model_dir):
    from cosy.frontend import server

    args = server.parse_args(["--model_dir", str(tiny_model_dir)])
    assert server.flow_batch(args, "cpu") == 1 and server.flow_batch(args, "cuda:0") == 8
    args = server.parse_args(["--model_dir", str(tiny_model_dir), "--flow_batch", "4"])
    assert server.flow_batch(args, "cpu") == 4
    with pytest.raises(SystemExit):
        server.parse_args(["--model_dir", str(tiny_model_dir), "--flow_batch", "0"])
    # a worker whose four whole-utterance flows may share one padded batch: each equals its solo run
    old = Engine.from_model_dir(tiny_model_dir)  # its LM uncapped, as the pool's worker
    reqs = [SynthesisRequest(mode="zero_shot", text=TEXTS[i], prompt_text=ZS_TEXT, prompt_wav=str(ZS_WAV), seed=i)
            for i in range(4)]
    assert_pool_equals_solo(EngineSpec(str(tiny_model_dir), max_batch=4, flow_batch=4, cache_mb=64), reqs, old)


@pytest.mark.quick
def test_the_record_of_batched_steps_stays_bounded():
    """A process runs millions of batched steps: the scheduler keeps only the last RECENT_BATCHES of them."""
    from cosy.speech.request import LiveRequest
    from cosy.speech.scheduler import RECENT_BATCHES, Batch

    s = SpeechScheduler(max_rows=2)
    batched = []  # one entry per batched step run (two requests' items at once)

    def same(args: list) -> list:  # one function: items batch together only with the same one
        batched.append(len(args))
        time.sleep(0.0002)
        return list(args)

    deadline = time.monotonic() + 60

    def client(i: int) -> None:
        s.bind(LiveRequest(i, "synthesize", {}))
        while len(batched) < RECENT_BATCHES + 100 and time.monotonic() < deadline:
            assert s.run(False, lambda: 1, batch=Batch(same, 1, 1)) == 1

    threads = [threading.Thread(target=client, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    s.close()
    assert len(batched) >= RECENT_BATCHES + 100  # enough batched steps ran
    assert len(s.batches) == RECENT_BATCHES and all(n == 2 for _, n in s.batches)


def test_a_stream_sure_to_reach_its_first_chunk_computes_the_prompt_chunk_ahead(engines, voice, monkeypatch):
    """A text whose LM min_len reaches the first chunk: the engine computes the prompt's last chunk ahead
    (while the LM makes the rest of the first chunk's tokens), with the same audio as the recomputing path;
    a short text, which may end before its first chunk, does not (its final pass would redo the work)."""
    from cosy.pipeline.token2wav import Token2WavStream

    old, new = engines
    calls = []
    real = Token2WavStream.compute_ahead

    def spy(self, job=None):
        calls.append(len(self.tokens))
        return real(self, job)

    monkeypatch.setattr(Token2WavStream, "compute_ahead", spy)
    long_text = "今天天气很好，我们一起去公园散步，看看花草树木，听听鸟儿唱歌，再去湖边坐一坐，晚上回家一起做饭吃。"
    for kw in (dict(mode="voice", voice=voice), dict(mode="zero_shot", prompt_wav=ZS_WAV)):
        req = SynthesisRequest(text=long_text, prompt_text=ZS_TEXT, seed=4, stream=True, **kw)
        want = list(old.synthesize(req))
        results: dict = {}
        live(new.speech_runner, new, req, 0, results)
        assert len(calls) == 1 and len(results[0]) == len(want) >= 2, (calls, len(want))  # first chunk, last
        for a, b in zip(results[0], want):
            assert a.shape == b.shape and (a - b).abs().max() < 1e-4
        calls.clear()
    live(new.speech_runner, new, SynthesisRequest(text=TEXTS[2], prompt_text=ZS_TEXT, seed=4, stream=True,
                                                  mode="voice", voice=voice), 1, results)
    assert not calls and results[1]
