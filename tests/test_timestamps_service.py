"""Sentence timings through the worker pool and `FrontendService` (issue 55): `on_sentence` is called in order
with the chunks (a begin before its sentence's first chunk, an end after its last), at max_batch 1 (the
worker's own loop) and above (`cosy.speech.worker`); the chunks are those of a request without it, and
`SynthesisResult.sentences` tile the whole audio with spans of the caller's text."""
from __future__ import annotations

import functools

import numpy as np
import pytest
from conftest import ASSETS
from test_timestamps import check_tiling
from worker_hooks import cap_lm

from cosy.deploy.data_dir import DataDir
from cosy.frontend.service import FrontendService
from cosy.pipeline.request import SynthesisRequest
from cosy.service.workers import EngineSpec, WorkerPool

# two sentences of more than 60 characters each: two segments (`cosy.text.split`), a number rewritten in each
FIRST = ("今天是2024年5月20日，我们一起去公园散步，看到了很多美丽的花朵和绿色的树木，"
         "还有一条小河在旁边慢慢地流过，心情非常愉快。")
SECOND = "明天的温度是25度，湿度80%，适合出门旅行和运动健身，大家一定要记得带上水和防晒霜，也别忘了带一把雨伞以防万一。"
TEXT = f"  {FIRST} {SECOND}\n"


@pytest.fixture(scope="module", params=[1, 2], ids=["max_batch1", "max_batch2"])
def service(request, tiny_model_dir, tmp_path_factory):
    pool = WorkerPool(EngineSpec(str(tiny_model_dir), max_batch=request.param), workers=1)
    pool.worker_prepare = functools.partial(cap_lm, cap=30)
    pool.start()
    try:
        yield FrontendService(pool, DataDir(tmp_path_factory.mktemp("data")))
    finally:
        pool.close()


def _request(**kw) -> SynthesisRequest:
    return SynthesisRequest(**{"mode": "cross_lingual", "prompt_wav": str(ASSETS / "cross_lingual_prompt.wav"),
                               "text": TEXT, "seed": 5, **kw})


def test_on_sentence_comes_in_order_with_the_chunks_and_changes_none(service):
    events: list = []
    for chunk in service.stream(_request(stream=True), "pai", on_sentence=events.append):
        events.append(chunk)
    plain = list(service.stream(_request(stream=True), "pai"))
    chunks = [e for e in events if isinstance(e, np.ndarray)]
    assert len(chunks) == len(plain) > 2 and all(np.array_equal(a, b) for a, b in zip(chunks, plain))
    timings = check_tiling(events)
    assert [t.text for t in timings] == [FIRST, SECOND]
    assert [(t.begin_index, t.end_index) for t in timings] == [(2, 2 + len(FIRST)), (3 + len(FIRST), len(TEXT) - 1)]
    assert timings[-1].end_sample == sum(len(c) for c in chunks) and timings[0].end_sample == timings[1].begin_sample


def test_a_whole_result_has_its_sentences(service):
    result = service.synthesize(_request(), "pai")
    sentences = result.sentences
    assert [s.text for s in sentences] == [FIRST, SECOND] and [s.index for s in sentences] == [0, 1]
    assert sentences[0].begin_sample == 0 and sentences[0].end_sample == sentences[1].begin_sample > 0
    assert sentences[1].end_sample == len(result.audio)
    assert all(s.sample_rate == result.sample_rate == 24000 for s in sentences)
    assert sentences[1].to_dict() == {"index": 1, "text": SECOND, "begin_time": sentences[1].begin_time,
                                      "end_time": round(len(result.audio) / 24), "begin_index": 3 + len(FIRST),
                                      "end_index": len(TEXT) - 1}
