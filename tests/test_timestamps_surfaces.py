"""In-process parts of the timestamp surfaces (issue 55): the WebUI's marked-up text and the subtitle format check
of the gradio API. The surfaces themselves run for real in test_timestamps_http, test_app and test_webui."""
from __future__ import annotations

import html
import re

import pytest

from cosy.errors import BadRequest
from cosy.frontend.gradio_api import indexed_text, subtitle_format
from cosy.frontend.webui import spoken_html
from cosy.pipeline.request import SynthesisRequest
from cosy.pipeline.timing import SentenceTiming

SPAN = re.compile(r'<span class="cosy-sentence" data-index="(\d+)" data-begin="(\d+)" data-end="(\d*)">(.*?)</span>')


def timing(index: int, text: str, begin: int, end: int, samples: tuple[int, int | None]) -> SentenceTiming:
    return SentenceTiming(index, text[begin:end], begin, end, samples[0], samples[1], 24000)


@pytest.mark.quick
def test_spoken_html_marks_each_sentence_span_and_escapes_the_rest():
    text = "A <b>bold</b> start. Then 2 & more!  "
    cut = text.index(".") + 1
    done = timing(0, text, 0, cut, (0, 24000))
    speaking = timing(1, text, cut + 1, len(text) - 2, (24000, None))  # still being spoken: no end yet
    out = spoken_html(text, [speaking, done])  # any order: shown in the text's order
    assert "<b>" not in out and "&lt;b&gt;bold&lt;/b&gt;" in out
    spans = SPAN.findall(out)
    assert spans == [("0", "0", "1000", html.escape(text[:cut], quote=False)),
                     ("1", "1000", "", html.escape(text[cut + 1:-2], quote=False))]
    # nothing of the text is lost or doubled: the markup removed, it reads as the text
    assert html.unescape(re.sub(r"<[^>]+>", "", out)) == text
    assert html.unescape(re.sub(r"<[^>]+>", "", spoken_html(text, []))) == text


@pytest.mark.quick
def test_subtitle_format_and_the_indexed_text():
    assert subtitle_format(" SRT ") == "srt" and subtitle_format("vtt") == "vtt"
    for bad in ("ass", "", None, 3):
        with pytest.raises(BadRequest, match="subtitle_format"):
            subtitle_format(bad)
    doc = '<speak>你好。<break time="1s"/>再<sub alias="见">贝</sub>。</speak>'
    assert indexed_text(SynthesisRequest(mode="voice", text=doc, ssml=True)) == \
        SynthesisRequest(mode="voice", text=doc, ssml=True).ssml_document().text
    assert indexed_text(SynthesisRequest(mode="voice", text=" 2024年 ")) == " 2024年 "
