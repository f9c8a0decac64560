"""say-as forces its reading: each interpret-as against the plain text a person writes for that reading
(`cosy.text.ssml_text.say_as`, `cosy.text.readings`), in Chinese and English documents and with a language hint."""
from __future__ import annotations

import pytest

from cosy.errors import BadRequest
from cosy.text.ssml import parse
from cosy.text.ssml_text import spoken_runs

pytestmark = pytest.mark.quick


def _said(doc: str, language: str | None = None) -> str:
    runs = spoken_runs(parse(doc), phoneme_tags=False, language=language)
    return "".join(r.text for r in runs if hasattr(r, "text"))


@pytest.mark.parametrize("kind, text, context, want", [
    ("characters", "123", "号码", "号码一二三"),
    ("characters", "A1", "型号", "型号A一"),
    ("cardinal", "123", "号码", "号码一百二十三"),
    ("cardinal", "2024", "今年是", "今年是两千零二十四"),
    ("cardinal", "10,001", "共", "共一万零一"),
    ("cardinal", "3.14", "约", "约三点一四"),
    ("cardinal", "-5", "气温", "气温负五"),
    ("date", "2024-05-20", "今天是", "今天是二零二四年五月二十日"),
    ("date", "2024/5/20", "今天是", "今天是二零二四年五月二十日"),
    ("time", "14:30", "现在", "现在十四点三十分"),
    ("time", "9:05:30", "现在", "现在九点零五分三十秒"),
    ("currency", "$12.50", "价格", "价格十二点五美元"),
    ("currency", "¥30", "价格", "价格三十元"),
    ("digits", "2024", "号码", "号码二零二四"),
])
def test_each_interpret_as_forces_its_chinese_reading(kind, text, context, want):
    assert _said(f'<speak>{context}<say-as interpret-as="{kind}">{text}</say-as></speak>') == want


@pytest.mark.parametrize("kind, text, fmt, want", [
    ("characters", "ab12", None, "In a b one two"),
    ("cardinal", "1990", None, "In one thousand, nine hundred and ninety"),
    ("cardinal", "3.05", None, "In three point zero five"),
    ("date", "05/20/2024", None, "In May twentieth, twenty twenty-four"),
    ("date", "20.05.2024", "dmy", "In May twentieth, twenty twenty-four"),
    ("date", "2024-05", "ym", "In May twenty twenty-four"),
    ("time", "14:30", None, "In fourteen thirty"),
    ("time", "2:05 pm", None, "In two oh five PM"),
    ("time", "9:00", None, "In nine o'clock"),
    ("currency", "$12.50", None, "In twelve dollars and fifty cents"),
    ("currency", "EUR 3", None, "In three euro"),
])
def test_each_interpret_as_forces_its_english_reading(kind, text, fmt, want):
    attr = f' format="{fmt}"' if fmt else ""
    assert _said(f'<speak>In <say-as interpret-as="{kind}"{attr}>{text}</say-as></speak>') == want


@pytest.mark.parametrize("language, kind, text, want", [
    ("de", "cardinal", "1.234,5", "eintausendzweihundertvierunddreißig Komma fünf"),
    ("de", "date", "20.05.2024", "zwanzigster Mai zweitausendvierundzwanzig"),
    ("fr", "time", "14:30", "quatorze heures trente"),
    ("es", "currency", "12,50 €", "doce euros con cincuenta céntimos"),
    ("ru", "cardinal", "21", "двадцать один"),
    ("ja", "date", "2024-05-20", "二千二十四年五月二十日"),
    ("ko", "time", "14:30", "열네 시 삼십 분"),
    ("it", "digits", "12", "uno due"),
])
def test_a_language_hint_gives_say_as_that_languages_words(language, kind, text, want):
    assert _said(f'<speak><say-as interpret-as="{kind}">{text}</say-as></speak>', language) == want


@pytest.mark.parametrize("kind, text, problem", [
    ("cardinal", "abc", "is not a number"),
    ("date", "2024-13-01", "month 13"),
    ("date", "1.2.3.4", "not a date"),
    ("time", "25:00", "hour 25"),
    ("time", "noon", "not a time"),
    ("currency", "12", "no currency"),
])
def test_text_that_is_not_of_its_kind_is_a_400_naming_say_as(kind, text, problem):
    with pytest.raises(BadRequest, match=f"say-as interpret-as=\"{kind}\".*{problem}"):
        _said(f'<speak>x<say-as interpret-as="{kind}">{text}</say-as></speak>')
