"""An SSML document (`cosy.text.ssml`) as what the text frontend reads: runs of text between the pauses, each a
list of pieces to normalize (text, sub aliases, say-as readings) and pieces taken as they are (phoneme tags).

    runs = spoken_runs(parse(doc), phoneme_tags=True)
    # [Run([("text", "请说"), ("tags", "[ch][óng][q][ìng]")]), Break(500), Run([("text", "好的")])]

A run of plain text that is only punctuation or symbols (`cosy.text.split.is_only_punctuation`, the rule by
which the normalizer drops such segments of plain text) has nothing to speak and is left out (the full stop
after a break); a document left with no run to speak, breaks or not, is refused as plain text with nothing
to speak is (a 400, before any audio).

say-as readings force their reading: the text becomes the words a person writes for it (`cosy.text.readings`),
which the normalizer passes through, whatever the context. The language is the request's hint when it names
one beyond Chinese and English (`cosy.text.language`), else the document's: Chinese if it holds any Chinese
character, else English. digits and telephone read digit by digit (Chinese 一二三, a telephone's 1 as 幺;
English one two three), characters one by one (digits as digit words, letters apart); cardinal the number
(一百二十三, "one hundred and twenty-three"), date a date (ymd, or `format` = mdy, dmy, ymd, ym, my, md, dm,
y, m or d; without one, a first part of four digits is the year, else English reads m/d/y and the others
d/m/y), time a clock time (H:MM[:SS], am/pm kept), currency an amount with a symbol or code ($12.50, 12,50 €,
USD 3). Text that is not of its kind is a 400 naming the say-as and the problem.

Phoneme tags are the CosyVoice3 tokenizer's own phoneme tokens (`cosy.text.specials.PHONEMES`): a pinyin
syllable is its initial and its tonal final (`chong2` -> `[ch][óng]`, the form the official frontend keeps
through Chinese normalization, `报道[j][ǐ]予好评`), a CMU phone itself (`AH0` -> `[AH0]`). A family without those
tokens (CosyVoice2) refuses <phoneme>.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from cosy.errors import BadRequest, echo
from cosy.text import readings
from cosy.text.language import localize
from cosy.text.normalize import contains_chinese
from cosy.text.specials import PHONEMES
from cosy.text.split import is_only_punctuation
from cosy.text.ssml import Break, Phoneme, SayAs, Ssml, Text

_DATE_ORDER = {"en": "mdy"}  # without a format or a leading year: d/m/y, except English m/d/y
_TIME = re.compile(r"(\d{1,2})\s*[:：時时点h]\s*(\d{2})?(?:\s*[:：分]\s*(\d{2}))?\s*[分秒]?\s*"
                   r"(am|pm|a\.m\.|p\.m\.)?", re.IGNORECASE)
_CURRENCY = re.compile(r"(?P<pre>[$€£¥￥₩₽]|[A-Za-z]{3}\b)?\s*(?P<amount>[+-]?\d[\d\s.,'’]*)\s*"
                       r"(?P<post>[$€£¥￥₩₽元円원]|[A-Za-z]{3})?")
_INITIALS = ("zh", "ch", "sh", "b", "p", "m", "f", "d", "t", "n", "l", "g", "k", "h", "j", "q", "x", "r", "z",
             "c", "s", "y", "w")
_MARKS = {"a": "āáǎà", "e": "ēéěè", "i": "īíǐì", "o": "ōóǒò", "u": "ūúǔù", "ü": "ǖǘǚǜ"}
_TAGS = frozenset(PHONEMES)


@dataclass
class Run:
    """Text between two pauses: ("text", s) pieces are normalized, ("tags", s) pieces are kept as they are."""

    pieces: list[tuple[str, str]] = field(default_factory=list)
    begin: int = 0  # where its items stand in the document's text content (`Ssml.text`), end exclusive
    end: int = 0

    @property
    def plain(self) -> bool:
        return all(kind == "text" for kind, _ in self.pieces)

    @property
    def text(self) -> str:
        return "".join(s for _, s in self.pieces)

    @property
    def silent(self) -> bool:
        """Nothing to speak: plain text of blanks, punctuation and symbols only."""
        return self.plain and is_only_punctuation(self.text.strip())


def spoken_runs(doc: Ssml, phoneme_tags: bool, language: str | None = None) -> list[Run | Break]:
    """The document as runs and pauses, in order (runs with nothing to speak dropped); BadRequest when no run
    is left to speak, a <say-as> text is not of its kind, or a <phoneme> cannot be read by this family
    (`phoneme_tags`: its tokenizer has the phoneme tokens) or names no such token. `language`: the request's
    hint (`cosy.text.language`); one beyond zh and en reads say-as in that language."""
    lang = language if language in readings.LANGUAGES and language not in ("zh", "en") else (
        "zh" if contains_chinese(doc.text) else "en")
    out: list[Run | Break] = []
    run, at = Run(), 0
    for item in doc.items:
        at += len(getattr(item, "text", ""))
        if isinstance(item, Break):
            out += [run, item] if run.pieces and not run.silent else [item]
            run = Run(begin=at, end=at)
            continue
        run.end = at
        if isinstance(item, Text):  # (a hint beyond zh and en: its numbers in that language)
            run.pieces.append(("text", localize(item.text, language)))
        elif isinstance(item, SayAs):
            run.pieces.append(("text", say_as(item, lang)))
        elif isinstance(item, Phoneme):
            if not phoneme_tags:
                raise BadRequest("<phoneme> needs a model whose tokenizer has phoneme tokens (CosyVoice3); this "
                                 "model reads text only: write the word as it sounds, or use <sub alias>")
            run.pieces.append(("tags", "".join(phoneme_tag(p, item.alphabet) for p in item.phones)))
    if run.pieces and not run.silent:
        out.append(run)
    if not any(isinstance(part, Run) for part in out):
        raise BadRequest("the SSML document has nothing to speak: its text is only punctuation or symbols"
                         + (" beside its breaks" if out else "") + " (as plain text, it would be refused the same)")
    return out


def say_as(item: SayAs, lang: str) -> str:
    """The words for one <say-as> in `lang` (one of `readings.LANGUAGES`); BadRequest when its text is not of
    its kind (a cardinal that is not a number, a date without a month ...)."""
    text = item.text.strip()
    kind = item.interpret_as
    try:
        if kind in ("digits", "telephone"):
            return _digits(text, lang, kind == "telephone")
        if kind == "characters":
            return _characters(text, lang)
        if kind == "cardinal":
            return readings.cardinal(text, lang)
        if kind == "date":
            return readings.date(*_date_parts(text, item.format, lang), lang)
        if kind == "time":
            return _time(text, lang)
        return _currency(text, lang)
    except ValueError as e:
        raise BadRequest(f'say-as interpret-as="{kind}": {echo(text)} {e}') from None


def _digits(text: str, lang: str, telephone: bool) -> str:
    words = []
    for c, word in zip(text, readings.digit_words(text, lang, telephone)):
        if c in "-– ()" and telephone:
            if words and words[-1] not in "，,":
                words.append("，" if lang in ("zh", "ja") else ",")  # a group's pause
        elif not c.isspace():
            words.append(word)
    joined = "".join(words) if lang in ("zh", "ja") else " ".join(words).replace(" ,", ",")
    return joined.strip("，, ")


def _characters(text: str, lang: str) -> str:
    """One by one: digits as digit words, letters apart (the normalizer keeps a blank between Latin letters)."""
    chars = [c for c in text if not c.isspace()]
    words = [w if c.isdigit() and c.isascii() else c for c, w in zip(chars, readings.digit_words("".join(chars), lang))]
    if lang not in ("zh", "ja"):
        return " ".join(words)
    out = ""
    for word in words:
        out += (" " if out and out[-1].isascii() and out[-1].isalpha() and word.isascii() else "") + word
    return out


def _date_parts(text: str, fmt: str | None, lang: str) -> tuple[int | None, int | None, int | None]:
    """(year, month, day) of a written date, in the order `fmt` names (ymd, dmy, ...) or the language's."""
    numbers = re.findall(r"\d+", text)
    if fmt is not None and (not fmt or set(fmt) - set("ymd") or len(set(fmt)) != len(fmt)):
        raise ValueError(f"has the format {fmt!r}: use letters y, m and d (ymd, dmy, mdy, ym, md, y ...)")
    if fmt is None:
        if len(numbers) == 3:
            fmt = "ymd" if len(numbers[0]) == 4 else _DATE_ORDER.get(lang, "dmy")
        elif len(numbers) == 2:
            fmt = "ym" if len(numbers[0]) == 4 else "my" if len(numbers[1]) == 4 else _DATE_ORDER.get(lang, "dmy")[:2]
        else:
            fmt = "y"
    if len(numbers) != len(fmt) or re.search(r"[^\d\s\-/.,年月日년월일]", text):
        raise ValueError(f"is not a date in the order {fmt} (write e.g. 2024-05-20, or name the order with format)")
    parts = dict(zip(fmt, map(int, numbers)))
    month, day = parts.get("m"), parts.get("d")
    if month is not None and not 1 <= month <= 12:
        raise ValueError(f"has no month {month} (1 to 12)")
    if day is not None and not 1 <= day <= 31:
        raise ValueError(f"has no day {day} (1 to 31)")
    return parts.get("y"), month, day


def _time(text: str, lang: str) -> str:
    m = _TIME.fullmatch(text)
    if m is None:
        raise ValueError("is not a time (write H:MM or H:MM:SS, am/pm after it if you like)")
    hour, minute, second = int(m[1]), int(m[2] or 0), int(m[3] or 0)
    if hour > 24:
        raise ValueError(f"has no hour {hour} (0 to 24)")
    if minute > 59 or second > 59:
        raise ValueError("has minutes or seconds above 59")
    suffix = (m[4] or "").replace(".", "").upper()
    return readings.time(hour, minute, second, lang, suffix)


def _currency(text: str, lang: str) -> str:
    m = _CURRENCY.fullmatch(text)
    mark = (m["pre"] or m["post"] or "") if m else ""
    code = readings.CURRENCY_SYMBOLS.get(mark, mark.upper())
    if m is None or not mark or m["pre"] and m["post"]:
        raise ValueError("names no currency (write a symbol or code with the amount: $12.50, 12,50 €, USD 3)")
    if code == "CNY" and mark in "¥￥" and lang == "ja":
        code = "JPY"  # ¥ in Japanese is the yen
    if code not in readings.CURRENCY_CODES:
        raise ValueError(f"names the currency {code}, which has no reading here "
                         f"(choose from {', '.join(readings.CURRENCY_CODES)})")
    return readings.money(m["amount"].strip(), code, lang)


def phoneme_tag(phone: str, alphabet: str) -> str:
    """One pinyin syllable (tone 1-5) or CMU phone as the CosyVoice3 phoneme tokens' text; BadRequest when
    the tokenizer has no such token."""
    if alphabet == "cmu":
        tags = f"[{phone}]"
    else:
        syllable, tone = phone[:-1], int(phone[-1])
        initial = next((i for i in _INITIALS if syllable.startswith(i) and len(syllable) > len(i)), "")
        # the tokens spell ü alone as ü (ǚ) and üe as ve (vè), as typed pinyin does
        final = syllable[len(initial):].replace("üe", "ve")
        if not any(c in final for c in "aeiouüv"):
            raise BadRequest(f"phoneme {phone!r} is not a pinyin syllable: its final has no vowel")
        final = _tone_marked("ü" if final == "v" else final, tone)
        tags = (f"[{initial}]" if initial else "") + f"[{final}]"
    missing = [t for t in tags.replace("][", "]\0[").split("\0") if t not in _TAGS]
    if missing:
        raise BadRequest(f"phoneme {phone!r} has no phoneme token {', '.join(missing)} in the CosyVoice3 tokenizer")
    return tags


def _tone_marked(final: str, tone: int) -> str:
    """The final with its tone mark (tone 5, neutral: none), on a or e, else o of ou, else the last vowel."""
    if tone == 5:
        return final
    if "a" in final or "e" in final:
        at = final.index("a" if "a" in final else "e")
    elif "ou" in final:
        at = final.index("o")
    else:
        at = max((k for k, c in enumerate(final) if c in _MARKS), default=-1)
        if at < 0:
            return final
    return final[:at] + _MARKS[final[at]][tone - 1] + final[at + 1:]
