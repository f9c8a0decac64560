"""Sentence timings from the engine (issue 55): turning them on changes no speech token and no sample (both
families, streamed and whole), the sentences tile the audio exactly (each one's samples are that sentence
spoken alone with its seed), SSML breaks are silences exactly between one sentence's end and the next one's
begin, and each sentence names its span of the caller's text."""
from __future__ import annotations

import pytest
import torch
from golden_engines import PROMPT

from cosy.pipeline.engine import Engine
from cosy.pipeline.lm_input import text_room
from cosy.pipeline.request import LM_FIXED_TOKENS, SynthesisRequest
from cosy.pipeline.timing import SentenceMark

pytestmark = pytest.mark.quick

# two sentences without a blank between them (each one's text alone is the piece the LM is given)
TEXTS = {"cv2": ("The day was good.", "And we went home."), "cv3": ("今天天气很好。", "我们回家了。")}


def _one_sentence_a_call(engine: Engine, sentences: tuple[str, ...]) -> None:
    """The LM's context made to hold one of `sentences` a call (`fit_context` cuts the text at their ends)."""
    prompt = engine.family.system_prompt  # cross_lingual: every piece keeps it
    room = max(len(engine.text.encode(prompt + s)) for s in sentences)
    context = LM_FIXED_TOKENS + room
    while text_room(engine.family, context - LM_FIXED_TOKENS) < room:
        context += 1
    engine.lm_context = lambda: context


def _run(engine: Engine, text: str, marks: bool, **kw) -> tuple[list, list[SentenceMark]]:
    """(chunks, marks) of one request, in the order they came; marks: whether `on_mark` is given."""
    req = SynthesisRequest(mode="cross_lingual", prompt_wav=PROMPT, text=text, **{"seed": 3, **kw})
    events: list = []
    chunks = engine.synthesize(req, on_mark=events.append) if marks else engine.synthesize(req)
    for chunk in chunks:
        events.append(chunk)
    return [e for e in events if isinstance(e, torch.Tensor)], events


def check_tiling(events: list) -> list:
    """The marks against the chunks around them: begin, the sentence's chunks, end, for each sentence; each
    sentence's samples are those counted between its marks. Returns the end marks' timings."""
    at, sentences, open_ = 0, [], None
    for e in events:
        if not isinstance(e, SentenceMark):  # a chunk (a tensor, or an array from a worker pool)
            at += len(e)
        elif e.kind == "begin":
            assert open_ is None and e.sentence.begin_sample == at and e.sentence.end_sample is None
            open_ = e.sentence
        else:
            assert open_ is not None and e.sentence.index == open_.index == len(sentences)
            assert (e.sentence.begin_sample, e.sentence.end_sample) == (open_.begin_sample, at)
            sentences.append(e.sentence)
            open_ = None
    assert open_ is None and sentences
    return sentences


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("family", ["cv2", "cv3"])
def test_timestamps_change_nothing_and_tile_the_audio(family, stream, request):
    engine, rec = request.getfixturevalue(family)
    sentences = TEXTS[family]
    context = engine.lm_context
    _one_sentence_a_call(engine, sentences)
    text = "".join(sentences)
    try:
        rec.take()
        plain, _ = _run(engine, text, marks=False, stream=stream)
        tokens = rec.take()
        marked, events = _run(engine, text, marks=True, stream=stream)
        assert rec.take() == tokens and len(tokens) == 2  # one LM call a sentence, the same tokens
        assert len(plain) == len(marked) and all(torch.equal(a, b) for a, b in zip(plain, marked))
        timings = check_tiling(events)
        audio = torch.cat(marked)
        assert [t.text for t in timings] == list(sentences)
        assert [(t.begin_index, t.end_index) for t in timings] == [(0, len(sentences[0])), (len(sentences[0]),
                                                                                            len(text))]
        assert timings[0].begin_sample == 0 and timings[-1].end_sample == audio.numel()
        assert timings[0].end_sample == timings[1].begin_sample  # no gap, no overlap
        assert timings[1].end_time == round(timings[1].end_sample * 1000 / 24000)
        if not stream:  # (streamed sentences are their own token2wav streams as well; whole ones are cheaper)
            for k, t in enumerate(timings):  # each sentence's samples: that sentence alone, seeded seed + k
                alone, _ = _run(engine, t.text, marks=False, seed=3 + k)
                assert torch.equal(audio[t.begin_sample:t.end_sample], torch.cat(alone))
    finally:
        engine.lm_context = context


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("family", ["cv2", "cv3"])
def test_an_ssml_break_is_silence_exactly_between_two_sentences(family, stream, request):
    engine, _ = request.getfixturevalue(family)
    before, after = TEXTS[family]
    doc = f'<speak>{before}<break time="250ms"/>{after}</speak>'
    plain, _ = _run(engine, doc, marks=False, ssml=True, stream=stream)
    marked, events = _run(engine, doc, marks=True, ssml=True, stream=stream)
    assert all(torch.equal(a, b) for a, b in zip(plain, marked)) and len(plain) == len(marked)
    audio = torch.cat(marked)
    first, second = (m.sentence for m in events if isinstance(m, SentenceMark) and m.kind == "end")
    assert second.begin_sample - first.end_sample == 250 * 24  # the break: 250 ms at 24 kHz
    assert torch.count_nonzero(audio[first.end_sample:second.begin_sample]) == 0
    assert first.begin_sample == 0 and second.end_sample == audio.numel()
    assert first.end_sample > 0 and second.end_sample > second.begin_sample
    # offsets into the document's text content, which is before + after
    assert (first.text, first.begin_index, first.end_index) == (before, 0, len(before))
    assert (second.text, second.begin_index, second.end_index) == (after, len(before), len(before) + len(after))
