"""Word timings in the worker (issue 55, `cosy.align.marks`): the engine's synthesize wrapped with the aligner
fills each finished sentence's words, from exactly that sentence's samples, before its "end" mark is passed
on; the audio is unchanged, and a request that does not ask for words gets none (and keeps no audio)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from golden_engines import PROMPT, golden_engine
from test_timestamps import _one_sentence_a_call

from cosy.align.aligner import Aligner, fill_words
from cosy.align.marks import with_words
from cosy.pipeline.request import SynthesisRequest
from cosy.verify.random_model import write_random_model

pytestmark = pytest.mark.quick

TEXT = ("今天天气很好。", "我们回家了。")


@pytest.fixture(scope="module")
def engine_and_aligner(tiny_cv3_model_dir, tmp_path_factory):
    engine, _ = golden_engine("golden-cv3", tiny_cv3_model_dir, tmp_path_factory)
    _one_sentence_a_call(engine, TEXT)
    aligner = Aligner.load(write_random_model(tmp_path_factory.mktemp("aligner"), "tiny", family="mms-aligner"))
    return engine, aligner


def _run(synthesize, words: bool, stream: bool) -> tuple[np.ndarray, list]:
    req = SynthesisRequest(mode="cross_lingual", prompt_wav=PROMPT, text="".join(TEXT), seed=3, stream=stream,
                           word_timestamps=words)
    marks: list = []
    chunks = [c.numpy() for c in synthesize(req, on_mark=lambda m: marks.append(copy.deepcopy(m)))]
    return np.concatenate(chunks), marks


def test_each_end_mark_carries_its_sentences_words(engine_and_aligner):
    engine, aligner = engine_and_aligner
    stream = True  # chunks that end inside a sentence: its samples gathered across them
    plain_audio, plain_marks = _run(engine.synthesize, False, stream)
    audio, marks = _run(with_words(engine.synthesize, aligner), True, stream)
    assert np.array_equal(audio, plain_audio)  # aligning changes no sample
    ends = [m for m in marks if m.kind == "end"]
    assert len(ends) == 2 and all(not m.sentence.words for m in marks if m.kind == "begin")
    caller = "".join(TEXT)
    for m in ends:
        s = m.sentence
        assert [w.text for w in s.words] == list(s.text.rstrip("。"))  # one word per Chinese character
        assert all(caller[w.begin_index:w.end_index] == w.text for w in s.words)
        assert all(s.begin_time <= w.begin_time <= w.end_time <= s.end_time for w in s.words)
        # the words are those of exactly this sentence's samples
        alone = copy.deepcopy(s)
        assert fill_words(aligner, alone, audio[s.begin_sample:s.end_sample]) == s.words
    # without word_timestamps the wrapped engine reports what the plain one does: no words
    _, unasked = _run(with_words(engine.synthesize, aligner), False, stream)
    assert [m.sentence.to_dict(words=True) for m in unasked] == [m.sentence.to_dict(words=True) for m in plain_marks]
    assert all(not m.sentence.words for m in unasked)


def test_closing_the_wrapped_stream_closes_the_engines(engine_and_aligner):
    engine, aligner = engine_and_aligner
    req = SynthesisRequest(mode="cross_lingual", prompt_wav=PROMPT, text="".join(TEXT), seed=3, stream=True,
                           word_timestamps=True)
    inner = []

    def synthesize(r, on_mark=None):
        inner.append(engine.synthesize(r, on_mark=on_mark))
        return inner[-1]

    chunks = with_words(synthesize, aligner)(req, on_mark=lambda m: None)
    assert isinstance(next(chunks), torch.Tensor)
    chunks.close()
    assert inner[0].gi_frame is None  # the engine's generator finished (its LM stopped)
