"""Language hints (`language_hints`, the managed service's name: a list, its first entry used): which language the
text's numbers, dates, times and amounts of money are read in.

    language = check_language(["de"])          # "de"; None for no hint; SynthesisError naming the field
    check_family_language("de", family)        # CosyVoice2 refuses what it does not speak
    localize("Am 20.05.2024 um 14:30 kostet es 12,50 €.", "de")
    # "Am zwanzigster Mai zweitausendvierundzwanzig um vierzehn Uhr dreißig kostet es zwölf Euro und fünfzig Cent."

zh and en (or no hint) are the official path: the normalizer picks Chinese or English rules by the text, exactly
as without a hint. The other languages CosyVoice3 speaks (LOCAL_LANGUAGES) read the text's numbers in that
language (`cosy.text.readings`, num2words) before the official path, which then finds no digit to read as English
(or, for Japanese text with kanji, as Chinese). CosyVoice2 speaks Chinese, English, Japanese and Korean
officially: a hint of another language is refused (a 400), not spoken with the wrong voice model.
"""
from __future__ import annotations

import re

from cosy.errors import BadRequest, echo
from cosy.text import readings
from cosy.text.origin import Origin

__all__ = ["HINTS", "LOCAL_LANGUAGES", "FAMILY_LANGUAGES", "check_language", "check_family_language", "localize",
           "localize_origin"]

HINTS = readings.LANGUAGES  # zh, en, de, es, fr, it, ru, ja, ko
LOCAL_LANGUAGES = tuple(lang for lang in HINTS if lang not in ("zh", "en"))
# what each family speaks officially (CosyVoice2: zh, en, ja, ko and Chinese dialects; CosyVoice3 adds de, es,
# fr, it, ru); a family not named here takes every hint
FAMILY_LANGUAGES = {"cosyvoice2": ("zh", "en", "ja", "ko")}
_ALIASES = {"jp": "ja", "kr": "ko", "cn": "zh"}
_SYMBOL = "[$€£¥￥₩₽]"
_CODE = "|".join(readings.CURRENCY_CODES)
_PERCENT = {"de": "Prozent", "es": "por ciento", "fr": "pour cent", "it": "per cento", "ru": "процентов",
            "ja": "パーセント", "ko": "퍼센트"}


def check_language(hints: object, name: str = "language_hints") -> str | None:
    """The hint to use: the first entry of a list (or a single string), lower-cased, a region dropped (de-DE ->
    de); None for none (None, [] or ""). BadRequest naming `name` and the choices for anything else."""
    if hints is None or hints == "" or hints == []:
        return None
    first = hints[0] if isinstance(hints, (list, tuple)) else hints
    if isinstance(first, str):
        code = re.split(r"[-_]", first.strip().lower(), maxsplit=1)[0]
        code = _ALIASES.get(code, code)
        if code in HINTS:
            return code
    raise BadRequest(f"{name}: unknown language {echo(first)} (choose from {', '.join(HINTS)}; a list, the first "
                     "entry is used)")


def check_family_language(language: str | None, family_name: str, display_name: str = "",
                          name: str = "language_hints") -> None:
    """BadRequest when the model family does not speak `language` officially (CosyVoice2: de, es, fr, it, ru)."""
    spoken = FAMILY_LANGUAGES.get(family_name)
    if language is None or spoken is None or language in spoken:
        return
    raise BadRequest(f"{name}: {display_name or family_name} does not speak {language!r} (it speaks "
                     f"{', '.join(spoken)}); CosyVoice3 speaks {', '.join(HINTS)}")


def _patterns(lang: str) -> re.Pattern:
    if lang in readings.DECIMAL_COMMA:
        number = r"\d{1,3}(?:[.\u00a0\u202f ]\d{3})+(?:,\d+)?(?!\d)|\d+(?:,\d+)?"
        date = r"(?P<d1>\d{1,2})[./](?P<m1>\d{1,2})[./](?P<y1>\d{4})"
    else:
        number = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\d)|\d+(?:\.\d+)?"
        date = r"(?P<y1>\d{4})[年년]\s?(?P<m1>\d{1,2})[月월]\s?(?P<d1>\d{1,2})[日일]?"
    sign = r"(?:(?<![\w.,])[-−])?"
    return re.compile(
        rf"(?P<date>(?P<y0>\d{{4}})-(?P<m0>\d{{1,2}})-(?P<d0>\d{{1,2}})(?!\d)|{date})"
        rf"|(?P<time>(?<![\d:])(?P<h>[01]?\d|2[0-4]):(?P<mi>[0-5]\d)(?::(?P<s>[0-5]\d))?(?![\d:]))"
        rf"|(?P<money>(?P<pre>{_SYMBOL}|(?:{_CODE})\s)\s?(?P<amount>{number})"
        rf"|(?P<amount2>{number})\s?(?P<post>{_SYMBOL}|[元円원]|\s(?:{_CODE})\b))"
        rf"|(?P<percent>(?P<pnum>{sign}(?:{number}))\s?%)"
        rf"|(?P<number>{sign}(?:{number}))")


def localize(text: str, language: str | None) -> str:
    """`text` with its dates, clock times, amounts of money, percentages and numbers as words of `language`
    (one of LOCAL_LANGUAGES; any other language, or None, returns `text` as it is)."""
    return localize_origin(text, language)[0]


def localize_origin(text: str, language: str | None) -> tuple[str, Origin]:
    """`localize(text, language)` and where it came from in `text` (`cosy.text.origin`: each number, date,
    time or amount read out is a region)."""
    if language not in LOCAL_LANGUAGES or not any(c.isdigit() for c in text):
        return text, Origin.identity(len(text))
    pattern = _patterns(language)

    def words(m: re.Match) -> str:
        try:
            if m["date"]:
                y, mo, d = (m["y0"], m["m0"], m["d0"]) if m["y0"] else (m["y1"], m["m1"], m["d1"])
                if 1 <= int(mo) <= 12 and 1 <= int(d or 1) <= 31:
                    return readings.date(int(y), int(mo), int(d) if d else None, language)
                return " ".join(readings.cardinal(int(n), language) for n in (y, mo, d) if n)
            if m["time"]:
                said = readings.time(int(m["h"]), int(m["mi"]), int(m["s"] or 0), language)
                if re.search(r"\b(?:las?|le|alle|dalle|l')\s*$", text[:m.start()], re.IGNORECASE):
                    said = re.sub(r"^(?:las?|le|l')\s*", "", said)  # the text has the article already
                return said
            if m["money"]:
                mark = (m["pre"] or m["post"]).strip()
                code = readings.CURRENCY_SYMBOLS.get(mark, mark)
                code = "JPY" if code == "CNY" and language == "ja" and mark in "¥￥" else code
                return readings.money(m["amount"] or m["amount2"], code, language)
            if m["percent"]:
                return readings.cardinal(m["pnum"].replace("−", "-"), language) + " " + _PERCENT[language]
            return readings.cardinal(m["number"].replace("−", "-"), language)
        except ValueError:  # a form the readings do not take: its digits one by one
            return " ".join(readings.digit_words("".join(c for c in m.group() if c.isdigit()), language))

    def digits(said: str) -> str:  # what no pattern took (a digit of another script): digit by digit
        return "".join(" ".join(readings.digit_words(c, language)) if c.isdigit() and c.isascii() else c
                       for c in said)

    out: list[str] = []
    replaced: list[tuple[int, int, int]] = []  # (begin, end, length said)

    def said(begin: int, end: int, words: str) -> None:
        out.append(words)
        if words != text[begin:end]:
            replaced.append((begin, end, len(words)))

    at = 0
    for m in pattern.finditer(text):
        for k in range(at, m.start()):
            said(k, k + 1, digits(text[k]))
        said(m.start(), m.end(), digits(_spaced(text, m, words(m))))
        at = m.end()
    for k in range(at, len(text)):
        said(k, k + 1, digits(text[k]))
    return "".join(out), Origin.replaced(len(text), replaced)


def _spaced(text: str, m: re.Match, words: str) -> str:
    """`words` with a blank where they would touch a Latin letter of the text around them."""
    before, after = text[m.start() - 1:m.start()], text[m.end():m.end() + 1]
    if before.isalpha() and before.isascii():
        words = " " + words
    if after.isalpha() and after.isascii():
        words += " "
    return words
