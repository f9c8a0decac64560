"""Sentence offsets into the caller's ORIGINAL text when the text is rewritten before the normalizer (issue 55
with issue 56's controls): the markdown filter, a language hint's readings, a lexicon replacement and a hot_fix
pronunciation, whole (plain and SSML) and duplex. Each sentence's text is the caller's text at its span, the
spans are in order and never overlap."""
from __future__ import annotations

import pytest
from conftest import ASSETS
from golden_engines import PROMPT, golden_engine
from test_timestamps import _one_sentence_a_call

from cosy.pipeline.duplex_marks import CallerText
from cosy.pipeline.engine import Engine
from cosy.pipeline.request import SynthesisRequest
from cosy.pipeline.timing import SentenceMark, SentenceTiming
from cosy.text.control import streamed_text
from cosy.text.lexicon import Entry

pytestmark = pytest.mark.quick

MARKDOWN = "# Title\n\nSome **bold** text. A [link](http://x)."
WHO = Entry("WHO", "sub", "World Health Organization")


@pytest.fixture(scope="module")
def tiny_cv2(tiny_model_dir):
    return Engine.from_model_dir(tiny_model_dir)


@pytest.fixture(scope="module")
def cv3(tiny_cv3_model_dir, tmp_path_factory):
    return golden_engine("golden-cv3", tiny_cv3_model_dir, tmp_path_factory)[0]


def check_spans(caller: str, sentences: list[SentenceTiming]) -> list[str]:
    """Each sentence's text is the caller's text at its span; the spans are in order and do not overlap."""
    assert sentences
    for s in sentences:
        assert 0 <= s.begin_index <= s.end_index <= len(caller)
        assert s.text == caller[s.begin_index:s.end_index], (s.text, caller[s.begin_index:s.end_index])
    assert all(a.end_index <= b.begin_index for a, b in zip(sentences, sentences[1:]))
    return [s.text for s in sentences]


def whole(engine: Engine, text: str, spoken: tuple[str, ...], **kw) -> list[SentenceTiming]:
    """The end marks of a whole request, the LM's context made to hold one of `spoken` (the rewritten
    sentences) a call."""
    context = engine.lm_context
    _one_sentence_a_call(engine, spoken)
    try:
        marks: list[SentenceMark] = []
        req = SynthesisRequest(mode="cross_lingual", prompt_wav=PROMPT, text=text, **{"seed": 3, **kw})
        for _ in engine.synthesize(req, on_mark=marks.append):
            pass
    finally:
        engine.lm_context = context
    return [m.sentence for m in marks if m.kind == "end"]


def test_markdown_whole(tiny_cv2):
    ends = whole(tiny_cv2, MARKDOWN, ("Title.", "Some bold text.", "A link."), markdown=True)
    assert check_spans(MARKDOWN, ends) == ["# Title", "Some **bold** text.", "A [link](http://x)."]


def test_language_hint_whole(cv3):
    text = "Es kostet 12,50 €. Am 20.05.2024 um 14:30 gehen wir."
    ends = whole(cv3, text, ("Es kostet zwölf Euro und fünfzig Cent.",
                             "Am zwanzigster Mai zweitausendvierundzwanzig um vierzehn Uhr dreißig gehen wir."),
                 language="de")
    assert check_spans(text, ends) == ["Es kostet 12,50 €.", "Am 20.05.2024 um 14:30 gehen wir."]


def test_lexicon_replacement_whole(tiny_cv2):
    text = "The WHO met. And we went home."
    ends = whole(tiny_cv2, text, ("The World Health Organization met.", "And we went home."), fixes=(WHO,))
    assert check_spans(text, ends) == ["The WHO met.", "And we went home."]


def test_hot_fix_pronunciation_and_replacement_whole(cv3):
    text = "我们去重庆。WHO很好。"
    fixes = (Entry("重庆", "py", "chong2 qing4"), Entry("WHO", "sub", "世界卫生组织"))
    ends = whole(cv3, text, ("我们去重庆。", "世界卫生组织很好。"), fixes=fixes)
    # (the phoneme's run ends before the full stop, which is spoken on its own)
    assert check_spans(text, ends) == ["我们去重庆", "。", "WHO很好。"]


def test_lexicon_replacement_in_ssml_indexes_the_documents_own_text(tiny_cv2):
    doc = '<speak>The WHO met.<break time="100ms"/>And we went home.</speak>'
    ends = whole(tiny_cv2, doc, ("The World Health Organization met.", "And we went home."), fixes=(WHO,), ssml=True)
    assert check_spans("The WHO met.And we went home.", ends) == ["The WHO met.", "And we went home."]


def test_markdown_and_lexicon_whole(tiny_cv2):
    text = "# The WHO\n\nWe **went** home."
    ends = whole(tiny_cv2, text, ("The World Health Organization.", "We went home."), markdown=True, fixes=(WHO,))
    assert check_spans(text, ends) == ["# The WHO", "We **went** home."]


def duplex(engine: Engine, pieces: list[str], seed: int, **kw) -> list[SentenceTiming]:
    marks: list[SentenceMark] = []
    req = SynthesisRequest(mode="cross_lingual", prompt_wav=str(ASSETS / "zero_shot_prompt.wav"), duplex=True,
                           seed=seed, stream=True, **kw)
    for _ in engine.synthesize_duplex(req, iter(pieces), on_mark=marks.append):
        pass
    begins = [m.sentence for m in marks if m.kind == "begin"]
    ends = [m.sentence for m in marks if m.kind == "end"]
    caller = "".join(pieces)
    check_spans(caller, begins)  # a begin holds what had arrived of its sentence
    assert all(b.begin_index == e.begin_index and b.end_index <= e.end_index for b, e in zip(begins, ends))
    return ends


def test_markdown_duplex(tiny_cv2):
    pieces = ["# Ti", "tle\n\nSome **bo", "ld** text. A [link](http", "://x)."]
    ends = duplex(tiny_cv2, pieces, 4, markdown=True)
    assert check_spans("".join(pieces), ends) == ["# Title", "Some **bold** text.", "A [link](http://x)."]


def test_lexicon_replacement_duplex(tiny_cv2):
    pieces = ["The WH", "O met. And we ", "went home."]
    ends = duplex(tiny_cv2, pieces, 4, fixes=(WHO,))
    assert check_spans("".join(pieces), ends) == ["The WHO met.", "And we went home."]


def test_markdown_and_lexicon_duplex(tiny_cv2):
    pieces = ["# The W", "HO\n\nWe **went** ho", "me."]
    ends = duplex(tiny_cv2, pieces, 4, markdown=True, fixes=(WHO,))
    assert check_spans("".join(pieces), ends) == ["# The WHO", "We **went** home."]


@pytest.mark.parametrize("markdown", [False, True])
def test_language_hint_duplex(markdown):
    """The duplex path's text side (`synthesize_duplex`'s CallerText over `streamed_text`; the tiny CosyVoice3
    LM, the one family that takes a `de` hint, draws a stop token bistream refuses on this text with every seed
    tried): the sentences of the text read map back to the pieces as sent."""
    pieces = ["Es **kostet** 12,", "50 €. Am 20.05.2024 um 14:30 ", "gehen wir."]
    if not markdown:
        pieces[0] = "Es kostet 12,"
    caller = CallerText()
    read = "".join(streamed_text(caller.record(iter(pieces)), "de", markdown, caller.origins))
    assert read.startswith("Es kostet zwölf Euro und fünfzig Cent. Am zwanzigster Mai")
    cut = read.index(" Am")
    first = caller.span(0, cut)
    second = caller.span(cut + 1, len(read.rstrip()), first[1])
    assert [first[2], second[2]] == [pieces[0] + "50 €.", "Am 20.05.2024 um 14:30 gehen wir."]
    assert all("".join(pieces)[b:e] == t for b, e, t in (first, second))


def test_origin_maps_rewritten_regions_region_to_region():
    """The position map alone: a kept text one to one, a rewritten region to its region, dropped text to the
    sentence after it (leading) or before it (trailing), spans clipped so they never overlap."""
    from cosy.text.origin import Origin, caller_spans

    caller = "A 12 b. **C** d"
    origin = Origin()
    origin.same(2)           # "A "
    origin.changed(2, 6)     # "12" -> "twelve"
    origin.same(4)           # " b. "
    origin.changed(2, 0)     # "**"
    origin.same(1)           # "C"
    origin.changed(2, 0)     # "**"
    origin.same(2)           # " d"
    out = "A twelve b. C d"
    assert origin.out_len == len(out) and origin.in_len == len(caller)
    assert caller_spans([(0, 11), (12, 15)], [origin], caller) == [(0, 7), (8, 15)]
    assert caller_spans([(0, 5), (5, 11)], [origin], caller) == [(0, 4), (5, 7)]  # a boundary inside "12"
