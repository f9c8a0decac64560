"""SSML through the engine on both families' golden models (the official weights' layout and numbers, with
the tiny models' prompt encoders): a break is exactly that many zero samples at its place, batch and
streaming; <sub> and <say-as> give the speech tokens of the equivalent plain text; rate and volume give the
audio of the speed field and of that gain; <phoneme> becomes CosyVoice3's phoneme tokens and is refused by
CosyVoice2."""
from __future__ import annotations

import pytest
import torch
from golden_engines import PROMPT

from cosy.errors import BadRequest
from cosy.pipeline.engine import Engine
from cosy.pipeline.request import SynthesisError, SynthesisRequest
from cosy.text.ssml import SsmlError

pytestmark = pytest.mark.quick


# (family fixture, text before, text after): English for the CosyVoice2 golden LM (its 4096 text ids)
TEXTS = {"cv2": ("The day was good.", "And we went home."), "cv3": ("今天天气很好。", "我们回家了。")}


def _audio(engine: Engine, text: str, ssml: bool = False, **kw) -> torch.Tensor:
    req = SynthesisRequest(mode="cross_lingual", prompt_wav=PROMPT, text=text, ssml=ssml, **{"seed": 3, **kw})
    return torch.cat(list(engine.synthesize(req)))


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("family", ["cv2", "cv3"])
def test_a_break_is_exactly_that_many_zeros_at_its_place(family, stream, request):
    engine, _ = request.getfixturevalue(family)
    before, after = TEXTS[family]
    got = _audio(engine, f'<speak>{before}<break time="250ms"/>{after}</speak>', ssml=True, stream=stream)
    first = _audio(engine, before, stream=stream)  # the run before the break: segment 0, seed 3
    second = _audio(engine, after, stream=stream, seed=4)  # the run after it: segment 1, seed 3 + 1
    n = 250 * 24  # 250 ms at 24 kHz
    assert first.numel() > 0 and second.numel() > 0  # (a random LM may stop at once: seeds chosen so it does not)
    assert got.numel() == first.numel() + n + second.numel()
    assert torch.equal(got[:first.numel()], first) and torch.equal(got[first.numel() + n:], second)
    assert torch.count_nonzero(got[first.numel():first.numel() + n]) == 0


@pytest.mark.parametrize("family, ssml, plain", [
    ("cv2", '<speak>We see <say-as interpret-as="digits">1 23</say-as> now.</speak>', "We see one two three now."),
    ("cv2", '<speak>We see <sub alias="the day">TD</sub> now.</speak>', "We see the day now."),
    ("cv3", '<speak>电话<say-as interpret-as="telephone">110</say-as>。</speak>', "电话幺幺零。"),
    ("cv3", '<speak><sub alias="世界卫生组织">WHO</sub>说的。</speak>', "世界卫生组织说的。"),
    # say-as forces its reading: the plain text a person writes for it (CosyVoice3's cross_lingual text is not
    # normalized, so "25" would stay digits there)
    ("cv3", '<speak>一共<say-as interpret-as="cardinal">25</say-as>个。</speak>', "一共二十五个。"),
    ("cv3", '<speak>号码<say-as interpret-as="characters">123</say-as>。</speak>', "号码一二三。"),
    ("cv3", '<speak>今天是<say-as interpret-as="date">2024-05-20</say-as>。</speak>', "今天是二零二四年五月二十日。"),
    ("cv3", '<speak>现在<say-as interpret-as="time">14:30</say-as>。</speak>', "现在十四点三十分。"),
    ("cv3", '<speak>价格<say-as interpret-as="currency">$12.50</say-as>。</speak>', "价格十二点五美元。"),
    # (the CosyVoice2 golden LM takes text ids below 4096 only: a few common words)
    ("cv2", '<speak>It is <say-as interpret-as="cardinal">3</say-as>.</speak>', "It is three."),
    ("cv2", '<speak>It is <say-as interpret-as="characters">ab</say-as>.</speak>', "It is a b."),
])
def test_sub_and_say_as_give_the_plain_texts_tokens(family, ssml, plain, request):
    engine, rec = request.getfixturevalue(family)
    rec.take()
    a = _audio(engine, ssml, ssml=True)
    tokens_ssml = rec.take()
    b = _audio(engine, plain)
    assert rec.take() == tokens_ssml and len(tokens_ssml) >= 1 and torch.equal(a, b)


@pytest.mark.parametrize("family", ["cv2", "cv3"])
def test_rate_and_volume_are_the_speed_field_and_a_gain(family, request):
    engine, _ = request.getfixturevalue(family)
    text = TEXTS[family][0]
    got = _audio(engine, f'<speak rate="1.5" volume="80">{text}</speak>', ssml=True)
    want = _audio(engine, text, speed=1.5) * 1.6  # volume 80 of 0-100, 50 unchanged
    assert torch.equal(got, want)
    with pytest.raises(SynthesisError, match="times the SSML rate 2 is out of range"):
        _audio(engine, f'<speak rate="2">{text}</speak>', ssml=True, speed=1.5)


def test_phoneme_becomes_cosyvoice3_phoneme_tokens_and_cosyvoice2_refuses_it(cv2, cv3):
    engine, rec = cv3
    tok = engine.text.tokenizer
    rec.take()
    _audio(engine, '<speak>去<phoneme alphabet="py" ph="chong2 qing4">重庆</phoneme>。</speak>', ssml=True)
    _audio(engine, "去[ch][óng][q][ìng]。")  # the official hotfix form: tags through Chinese normalization
    assert len(rec.calls) == 2 and rec.calls[0] == rec.calls[1]
    segs = engine.text.tagged_segments([("text", "Say "), ("tags", "[HH][AH0][L][OW1]"), ("text", " twice.")])
    ids = [i for _, s in segs for i in s]
    assert [tok.token_id(t) for t in ("[HH]", "[AH0]", "[L]", "[OW1]")] == ids[ids.index(tok.token_id("[HH]")):][:4]
    with pytest.raises(BadRequest, match="phoneme 'liang5' has no phoneme token"):
        _audio(engine, '<speak><phoneme alphabet="py" ph="liang5">两</phoneme></speak>', ssml=True)
    with pytest.raises(BadRequest, match="needs a model whose tokenizer has phoneme tokens"):
        _audio(cv2[0], '<speak>The <phoneme alphabet="cmu" ph="T AH0">the</phoneme> end.</speak>', ssml=True)


def test_bad_documents_and_modes_are_refused_before_any_synthesis(cv2):
    engine, rec = cv2
    rec.take()
    with pytest.raises(SsmlError, match="SSML line 1, column 8: unknown tag <b>"):
        _audio(engine, "<speak><b>x</b></speak>", ssml=True)
    with pytest.raises(SynthesisError, match="empty"):
        _audio(engine, '<speak> <break time="1s"/> </speak>', ssml=True)
    with pytest.raises(SynthesisError, match="mode 'vc' has no text"):
        SynthesisRequest(mode="vc", source_wav=PROMPT, prompt_wav=PROMPT, text="<speak>x</speak>", ssml=True).check()
    assert rec.calls == []
