"""Language hints and the markdown filter (docs/api/text-control.md): what the text becomes (in-process), and
through the engine on both families' golden models, the speech tokens of a request with them equal those of the
hand-written equivalent text; without them nothing changes."""
from __future__ import annotations

import random

import pytest
import torch
from golden_engines import PROMPT

from cosy.errors import BadRequest
from cosy.pipeline.request import SynthesisRequest
from cosy.text.control import plain_text, streamed_text
from cosy.text.language import check_family_language, check_language, localize
from cosy.text.markdown import MarkdownStream, to_speech

pytestmark = pytest.mark.quick

DOC = """# 标题

Some **bold** and *em* text with [a link](http://x.y) and ![a cat](c.png) and `code`.
Second line

- one
- two **2**

1. first
2. second

| Name | Age |
| --- | --- |
| Bob | 3 |

```python
print(1)
```

> quoted
> more

<div>html</div>

---
~~gone~~ end"""
SPOKEN = ("标题。 Some bold and em text with a link and a cat and code. Second line. one. two 2. first. second. "
          "Name, Age. Bob, 3. quoted more. gone end.")


def test_markdown_becomes_what_a_listener_hears():
    assert to_speech(DOC) == SPOKEN
    assert to_speech("Plain text, no markup.") == "Plain text, no markup."
    assert to_speech("## 今天的天气\n\n**晴**，气温很高") == "今天的天气。 晴，气温很高。"


@pytest.mark.parametrize("seed", range(40))
def test_markdown_in_pieces_is_the_whole_texts_speech(seed):
    r = random.Random(seed)
    cuts = sorted(r.sample(range(1, len(DOC)), r.randint(1, 40)))
    stream, out, prev = MarkdownStream(), [], 0
    for cut in cuts + [len(DOC)]:
        out.append(stream.feed(DOC[prev:cut]))
        prev = cut
    out.append(stream.finish())
    assert "".join(out).split() == SPOKEN.split()


def test_complete_blocks_are_released_before_the_text_ends():
    stream = MarkdownStream()
    assert stream.feed("# Title\nSome te") == "Title. "  # the heading is complete at its line's end
    assert stream.feed("xt\n") == ""  # a paragraph may go on in the next line
    assert stream.feed("\n- a\n") == "Some text. "  # a blank line ends it
    assert stream.feed("- b") == "a. "  # the next item starts: the first one is complete
    assert stream.finish() == "b."


def test_malformed_markdown_never_crashes():
    r = random.Random(0)
    alphabet = "#*_`[]()!|-+>~\n \t1.:<>/\\abc中文\u200b"
    for _ in range(300):
        text = "".join(r.choice(alphabet) for _ in range(r.randint(0, 80)))
        assert isinstance(to_speech(text), str)
        stream = MarkdownStream()
        pieces = [stream.feed(text[i:i + 7]) for i in range(0, len(text), 7)] + [stream.finish()]
        assert all(isinstance(p, str) for p in pieces)


def test_language_hints_take_the_first_entry_and_refuse_unknown_ones():
    assert check_language(["de", "en"]) == "de"
    assert check_language("fr-FR") == "fr" and check_language([]) is None and check_language(None) is None
    for bad in (["xx"], [3], "klingon"):
        with pytest.raises(BadRequest, match=r"language_hints: unknown language .* \(choose from zh, en, de, es"):
            check_language(bad)
    with pytest.raises(BadRequest, match="input.language_hints: unknown language 'xx'"):
        check_language(["xx"], "input.language_hints")
    with pytest.raises(BadRequest, match="language_hints: CosyVoice2 does not speak 'de'"):
        check_family_language("de", "cosyvoice2", "CosyVoice2")
    check_family_language("ja", "cosyvoice2")  # CosyVoice2 speaks zh, en, ja, ko
    check_family_language("de", "cosyvoice3")


@pytest.mark.parametrize("lang, text, want", [
    ("de", "Am 20.05.2024 um 14:30 kostet es 12,50 €.",
     "Am zwanzigster Mai zweitausendvierundzwanzig um vierzehn Uhr dreißig kostet es zwölf Euro und fünfzig Cent."),
    ("fr", "Il a 3,5 kg et 50 % de plus.", "Il a trois virgule cinq kg et cinquante pour cent de plus."),
    ("es", "Son 1.000 personas.", "Son mil personas."),
    ("it", "Alle 14:30 costa 3 €.", "Alle quattordici e trenta costa tre euro."),
    ("ru", "В 2024 году 21 человек.", "В две тысячи двадцать четыре году двадцать один человек."),
    ("ja", "2024年5月20日に¥1,200です。", "二千二十四年五月二十日に千二百円です。"),
    ("ko", "12,000원입니다.", "만 이천 원입니다."),
])
def test_a_hint_reads_numbers_dates_times_and_money_in_its_language(lang, text, want):
    assert localize(text, lang) == want


@pytest.mark.parametrize("lang", [None, "zh", "en"])
def test_without_a_hint_beyond_zh_and_en_the_text_is_untouched(lang):
    text = "今天是2024年5月20日, it costs $12.50 at 14:30."
    assert plain_text(text, lang) == text and list(streamed_text(["a 1", "2 b"], lang)) == ["a 1", "2 b"]


def test_streamed_hint_holds_a_number_back_until_it_ends():
    assert "".join(streamed_text(["Es sind 1", "2 Leute."], "de")) == "Es sind zwölf Leute."


def test_request_refuses_markdown_with_ssml_and_an_unknown_hint():
    with pytest.raises(BadRequest, match="enable_markdown_filter applies to plain text"):
        SynthesisRequest(mode="voice", text="<speak>x</speak>", ssml=True, markdown=True).check()
    with pytest.raises(BadRequest, match="language_hints: unknown language 'xx'"):
        SynthesisRequest(mode="voice", text="x", language="xx").check()


def _tokens(engine_rec, text: str, duplex: bool = False, **kw) -> tuple[list[list[int]], torch.Tensor]:
    engine, rec = engine_rec
    rec.take()
    req = SynthesisRequest(mode="cross_lingual", prompt_wav=PROMPT, text=text, seed=3, **kw)
    audio = torch.cat(list(engine.synthesize(req)))
    return rec.take(), audio


@pytest.mark.parametrize("family, text, kw, plain", [
    # (the CosyVoice2 golden LM takes text ids below 4096 only: a few common English words)
    ("cv2", "# The day\n\nWe see **the** [day](http://x.y) now.", {"markdown": True}, "The day. We see the day now."),
    ("cv2", "We see the day now.", {"language": "en"}, "We see the day now."),
    ("cv3", "## 今天的天气\n\n**晴**，气温*很高*", {"markdown": True}, "今天的天气。 晴，气温很高。"),
    ("cv3", "Es kostet 12,50 € um 14:30.", {"language": "de"},
     "Es kostet zwölf Euro und fünfzig Cent um vierzehn Uhr dreißig."),
    ("cv3", "2024年5月20日です。", {"language": "ja"}, "二千二十四年五月二十日です。"),
])
def test_speech_tokens_equal_the_hand_written_texts(family, text, kw, plain, request):
    engine_rec = request.getfixturevalue(family)
    got, audio = _tokens(engine_rec, text, **kw)
    want, want_audio = _tokens(engine_rec, plain)
    assert got == want and len(want) >= 1 and torch.equal(audio, want_audio)


def test_cosyvoice2_refuses_a_language_it_does_not_speak(cv2):
    with pytest.raises(BadRequest, match="CosyVoice2 does not speak 'de'"):
        _tokens(cv2, "We see 3 days.", language="de")
