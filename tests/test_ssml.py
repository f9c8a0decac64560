"""cosy.text.ssml: the managed service's SSML subset parsed into text, readings, pronunciations and pauses;
every malformed or unsupported document refused with its line and column."""
from __future__ import annotations

import time

import pytest
from conftest import assert_linear

from cosy.errors import BadRequest
from cosy.text.ssml import (
    MAX_BREAK_MS,
    Break,
    Phoneme,
    SayAs,
    SsmlError,
    Text,
    looks_like_ssml,
    parse,
)

pytestmark = pytest.mark.quick


def test_a_document_becomes_items_in_order_with_speed_and_gain():
    doc = parse('<?xml version="1.0"?>\n<speak rate="1.25" volume="80" pitch="1">请闭上眼睛<break time="500ms"/>'
                '好了。<sub alias="世界卫生组织">WHO</sub>的电话是<say-as interpret-as="telephone">12345</say-as>，'
                '<phoneme alphabet="py" ph="chong2 qing4">重庆</phoneme>到了<break time="1.5s"/></speak>')
    assert doc.speed == 1.25 and doc.volume == pytest.approx(1.6)
    assert doc.items == (Text("请闭上眼睛"), Break(500), Text("好了。世界卫生组织的电话是"),
                         SayAs("12345", "telephone"), Text("，"), Phoneme("重庆", "py", ("chong2", "qing4")),
                         Text("到了"), Break(1500))
    assert doc.silence_ms == 2000 and doc.text == "请闭上眼睛好了。世界卫生组织的电话是12345，重庆到了"
    plain = parse("<speak>Hello &amp; welcome</speak>")
    assert plain.items == (Text("Hello & welcome"),) and (plain.speed, plain.volume) == (1.0, 1.0)
    cmu = parse('<speak><phoneme alphabet="cmu" ph="HH AH0 L OW1">hello</phoneme></speak>')
    assert cmu.items == (Phoneme("hello", "cmu", ("HH", "AH0", "L", "OW1")),)


def test_looks_like_ssml():
    assert looks_like_ssml("<speak>x</speak>") and looks_like_ssml(' <?xml version="1.0"?> <speak rate="1">x</speak>')
    assert not looks_like_ssml("你好 <speak>") and not looks_like_ssml("<speaker>x</speaker>")


@pytest.mark.parametrize("doc, where, words", [
    ("你好", (1, 1), "not SSML"),
    ("<speak>你好", (1, 10), "malformed XML: no element found"),
    ("<speak>a</speak>b", (1, 17), "junk after document element"),
    ("<speak>\n  <b>x</b></speak>", (2, 3), "unknown tag <b>"),
    ('<speak>\n<break time="500"/></speak>', (2, 1), "use milliseconds or seconds"),
    (f'<speak><break time="{MAX_BREAK_MS + 1}ms"/></speak>', (1, 8), "from 1 to 10000"),
    ('<speak><break time="0.5ms"/></speak>', (1, 8), "whole milliseconds"),
    ('<speak><break/></speak>', (1, 8), "needs a time attribute"),
    ('<speak><break time="1s">x</break></speak>', (1, 25), "<break> holds nothing"),
    ('<speak rate="3">x</speak>', (1, 1), "rate='3'>: a number from 0.5 to 2"),
    ('<speak volume="loud">x</speak>', (1, 1), "volume='loud'"),
    ('<speak pitch="1.2">x</speak>', (1, 1), "pitch is not supported"),
    ('<speak voice="longxiaochun">x</speak>', (1, 1), "<speak> has no attribute voice"),
    ('<speak><speak>x</speak></speak>', (1, 8), "must be the root, once"),
    ('<speak><sub>WHO</sub></speak>', (1, 8), "needs a alias attribute"),
    ('<speak><sub alias="a"><break time="1s"/></sub></speak>', (1, 23), "<sub> holds text only"),
    ('<speak><say-as interpret-as="spell">x</say-as></speak>', (1, 8), "interpret-as 'spell' is not supported"),
    ('<speak><say-as interpret-as="digits"> </say-as></speak>', (1, 39), "<say-as> is empty"),
    ('<speak><phoneme alphabet="ipa" ph="x">x</phoneme></speak>', (1, 8), "alphabet 'ipa'"),
    ('<speak><phoneme alphabet="py" ph="chong">重</phoneme></speak>', (1, 8), "'chong' is not pinyin with a tone"),
    ('<speak><phoneme alphabet="cmu" ph="HH AH4 L">x</phoneme></speak>', (1, 8), "'AH4' is not a CMU phone"),
    ('<!DOCTYPE speak [<!ENTITY a "aaaa">]><speak>&a;</speak>', (1, 17), "a DOCTYPE is not accepted"),
    ('<speak><!DOCTYPE x></speak>', (1, 10), "malformed XML"),
])
def test_malformed_or_unsupported_is_refused_with_line_and_column(doc, where, words):
    with pytest.raises(SsmlError) as e:
        parse(doc)
    assert (e.value.line, e.value.column) == where, str(e.value)
    assert words in str(e.value) and str(e.value).startswith(f"SSML line {where[0]}, column {where[1]}: ")
    assert isinstance(e.value, BadRequest) and e.value.status == 400


def test_silence_in_all_is_bounded():
    ten = '<break time="10s"/>'
    assert parse(f"<speak>{ten * 6}</speak>").silence_ms == 60_000
    with pytest.raises(SsmlError, match="breaks add up to 70000 ms; at most 60000"):
        parse(f"<speak>{ten * 7}</speak>")


def test_entities_cannot_be_declared():
    bomb = '<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY a "x">]><speak>&a;</speak>'
    with pytest.raises(SsmlError, match="DOCTYPE is not accepted"):
        parse(bomb)


@pytest.mark.parametrize("head", ["<!DOCTYPE", "<!DOCTYPE speak [", '<?xml version="1.0"?><!DOCTYPE', "<?xml", ""])
def test_looks_like_ssml_is_linear_in_the_blanks_after_a_head(head):
    """A start of a document followed by many blanks (one WebSocket message held a frontend's event loop: the
    pattern backtracked quadratically): ten times the blanks costs about ten times as long."""
    assert looks_like_ssml(head + " " * 200_000) == looks_like_ssml(head + " " * 20_000)
    assert_linear(looks_like_ssml, lambda n: head + " " * n, 20_000, 200_000)


@pytest.mark.parametrize("text, ssml", [
    ("<speak>x</speak>", True), ("  \n<speak rate='1'>x</speak>", True), ("<speak/>", True),
    ('<?xml version="1.0"?>\n<speak>x</speak>', True),
    # a DOCTYPE or an XML declaration is markup, whatever follows: the parser says what is wrong with it
    ("<!DOCTYPE speak><speak>x</speak>", True), ("<!DOCTYPE" + " " * 100, True), ("<?xml?><html/>", True),
    ("", False), ("   ", False), ("你好 <speak>", False), ("<speaker>x</speaker>", False), ("<sp", False),
    ("<!-- a comment --><speak>x</speak>", False), ("<!doctype x>", False),
])
def test_what_looks_like_ssml(text, ssml):
    assert looks_like_ssml(text) is ssml


def test_a_doctype_with_nothing_after_it_is_refused_with_its_place():
    for doc in ("<!DOCTYPE" + " " * 200_000, "<!DOCTYPE speak [" + " " * 200_000):
        start = time.perf_counter()
        with pytest.raises(SsmlError) as e:
            parse(doc)
        assert time.perf_counter() - start < 1.0
        assert "malformed XML: no element found" in str(e.value) or "DOCTYPE" in str(e.value), str(e.value)


LONG = "9" * 19_000


@pytest.mark.parametrize("doc", [
    f'<speak><break time="{LONG}"/></speak>',
    f'<speak rate="{LONG}">x</speak>',
    f'<speak volume="{LONG}">x</speak>',
    f'<speak pitch="{LONG}">x</speak>',
    f'<speak a{LONG}="1">x</speak>',
    f'<speak><x{LONG}>y</x{LONG}></speak>',
    f'<speak><say-as interpret-as="{LONG}">1</say-as></speak>',
    f'<speak><phoneme alphabet="{LONG}" ph="a1">x</phoneme></speak>',
    f'<speak><phoneme alphabet="py" ph="{LONG}">x</phoneme></speak>',
    f'<speak><phoneme alphabet="cmu" ph="{LONG}">x</phoneme></speak>',
])
def test_errors_quote_at_most_80_characters_of_what_was_sent(doc):
    """An error names the offending value, cut to 80 characters with an ellipsis (one echoed 19 KB)."""
    with pytest.raises(SsmlError) as e:
        parse(doc)
    msg = str(e.value)
    assert "9" * 70 in msg and "9" * 81 not in msg and "…" in msg, msg[:300]
    assert len(msg) < 400, len(msg)
