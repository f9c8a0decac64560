"""Duplex synthesis below the WebSockets: streamed-text normalization, and a duplex job through a worker pool
that holds several requests at once (max_batch 2: `cosy.speech.worker`), cancelled mid-text."""
from __future__ import annotations

import queue
import re
import threading
import time

import numpy as np
import pytest
from conftest import ASSETS

from cosy.errors import Cancelled
from cosy.pipeline.duplex import text_segments
from cosy.pipeline.engine import Engine
from cosy.pipeline.request import LM_DUPLEX_SEGMENT_TOKENS, SynthesisError, SynthesisRequest, lm_tokens_needed
from cosy.service.workers import EngineSpec, WorkerPool
from cosy.text.frontend import TextFrontend
from cosy.text.stream import sentence_parts, split_tail, stream_pieces
from cosy.text.tokenizer import TextTokenizer

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")


def test_split_tail_holds_back_what_may_continue():
    assert split_tail("今天是20") == ("今天是", "20")
    assert split_tail("Hello wor") == ("Hello", " wor")
    assert split_tail("你好，") == ("你好，", "")
    assert split_tail("3.") == ("", "3.")


def test_stream_pieces_never_breaks_numbers_or_words(tiny_model_dir):
    text = TextFrontend(TextTokenizer.from_dir(tiny_model_dir / "CosyVoice-BlankEN"))
    whole = text.normalize("今天是2024年5月20日。", split=False)[0]
    pieces = list(stream_pieces(text, ["今天是20", "24年5", "月20日。"]))
    assert "".join(pieces) == whole and "二零二四" in whole
    english = list(stream_pieces(text, ["I have 1", "2 app", "les."]))
    words = re.findall(r"[a-z]+", "".join(english).lower())  # (the normalizer's spacing around . may differ)
    assert words == re.findall(r"[a-z]+", text.normalize("I have 12 apples.", split=False)[0].lower())
    assert words == ["i", "have", "twelve", "apples"] and all(p for p in english)


@pytest.fixture(scope="module")
def batch_pool(tiny_model_dir):
    pool = WorkerPool(EngineSpec(str(tiny_model_dir), max_batch=2), workers=1, max_queue=4).start()
    yield pool
    pool.close()


def request(**kw) -> SynthesisRequest:
    return SynthesisRequest(mode="cross_lingual", prompt_wav=str(ASSETS / "zero_shot_prompt.wav"), duplex=True,
                            seed=4, stream=True, **kw)


def test_duplex_in_a_batching_worker_and_cancel_mid_text(batch_pool):
    text = queue.Queue()
    for piece in ["one", " two", " three", " four", " five", " six"]:
        text.put(piece)
    text.put(None)
    taken = []
    chunks = list(batch_pool.synthesize_duplex(request(), text, on_text=taken.append))
    assert "".join(taken).split() == ["one", "two", "three", "four", "five", "six"]  # what the LM read, in order
    assert len(chunks) >= 1 and sum(len(c) for c in chunks) / 24000 >= 15 / 25
    assert all(c.dtype == np.float32 for c in chunks)

    # a job whose text never ends: cancelled from another thread, the slot is freed at once
    cancelled, stuck = threading.Event(), queue.Queue()
    stuck.put("hello")
    threading.Timer(1.0, cancelled.set).start()
    start = time.monotonic()
    try:  # ends (the worker answers done at once, or the reader sees the cancel first) though the text never did
        list(batch_pool.synthesize_duplex(request(), stuck, cancelled))
    except Cancelled:
        pass
    assert time.monotonic() - start < 15
    for _ in range(50):
        if batch_pool.stats()["busy"] == 0:
            break
        time.sleep(0.1)
    assert batch_pool.stats()["busy"] == 0


def test_duplex_request_rules():
    with pytest.raises(SynthesisError, match="no text to stream"):
        SynthesisRequest(mode="vc", duplex=True).check()
    SynthesisRequest(mode="cross_lingual", duplex=True).check()  # the text comes later


def test_sentence_parts_cut_after_end_marks_and_quotes():
    assert sentence_parts("你好。“好”！Ok? go") == [("你好。", True), ("“好”！", True), ("Ok?", True), (" go", False)]
    assert sentence_parts("苹果、香蕉：橘子") == [("苹果、香蕉：橘子", False)]  # lists and clauses stay whole
    assert sentence_parts("") == [] and sentence_parts("。") == [("。", True)]


def test_a_whole_sentence_is_spoken_before_the_text_ends(tiny_model_dir):
    """The LM decodes the duplex text per sentence: complete sentences are spoken while the text is still
    open (one bistream over the whole text gives 15 speech tokens per 5 text ids until its end: 13 ids of
    three sentences made 30 tokens, short of the first chunk, and nothing was heard until finish-task)."""
    engine = Engine.from_model_dir(tiny_model_dir)
    text = queue.Queue()
    text.put("今天天气很好。我们去公园散步吧。你觉得怎么样？")
    ended = threading.Event()

    def end_text() -> None:  # a failing test ends, late, instead of hanging
        ended.set()
        text.put(None)

    timer = threading.Timer(120.0, end_text)
    timer.start()
    chunks = engine.synthesize_duplex(request(), iter(text.get, None))
    try:
        first = next(chunks)
        assert not ended.is_set() and first.numel() > 0, "no audio until the text ended"
    finally:
        timer.cancel()
        text.put(None)
    # the rest follows the text's end (a random LM runs each sentence to its max_len: one chunk shows it)
    assert next(chunks).numel() > 0
    chunks.close()  # a client that leaves mid-stream: the generator ends at once


def test_duplex_segments_hold_at_most_the_budgeted_ids(tiny_model_dir):
    """A sentence that never ends is cut into LM segments of LM_DUPLEX_SEGMENT_TOKENS ids, so the LM's
    context holds one segment however long the streamed text (check_lm_budget keeps room for one)."""
    engine = Engine.from_model_dir(tiny_model_dir)
    pieces = ["今天天气很好我们一起去公园散步看看花草树木听听鸟儿唱歌"] * 12 + ["。", "好。"]
    segments = [[ids[0] for ids in segment] for segment in text_segments(engine.text, iter(pieces))]
    every = [i for _, ids in ((p, engine.text.encode(p)) for p in pieces) for i in ids]
    assert [i for s in segments for i in s] == every  # all of the text, in order, one id per piece
    assert max(map(len, segments)) == LM_DUPLEX_SEGMENT_TOKENS and len(segments) >= 3
    assert segments[-1] == engine.text.encode("好。")  # the last sentence on its own
    need = lm_tokens_needed(SynthesisRequest(mode="cross_lingual", duplex=True))
    assert need == 2 + LM_DUPLEX_SEGMENT_TOKENS * 21
