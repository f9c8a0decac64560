"""A sentence's words, as spans of the caller's text, and the letters the aligner's vocabulary can align.

Chinese (and Japanese kana) is one "word" per character, as the managed CosyVoice service reports it; other
text is split on whitespace, each word without the punctuation at its edges ("world," -> "world").
Punctuation alone is no word. Each word is romanized with uroman (the romanizer the MMS aligner was trained
with and the `ctc-forced-aligner` package uses: Chinese characters become toneless pinyin, accents are
dropped) and keeps the letters of the model's vocabulary (a-z and the apostrophe for the MMS aligner). A word
with none (digits, symbols: the normalizer spoke them as words the text does not show) gets no tokens of its
own; `cosy.align.aligner` times it by the gap its neighbours leave.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

# one "word" per character: CJK ideographs (with extensions and compatibility forms), kana
_PER_CHAR = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]")
_SPLIT = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]|[^\s\u3040-\u30ff"
                    r"\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]+")


@dataclass(frozen=True)
class Word:
    """`text[begin:end]` of the sentence, and its romanized letters (maybe none)."""

    text: str
    begin: int
    end: int
    letters: str


def _is_core(ch: str) -> bool:
    """Letters, digits and marks belong to a word; punctuation and symbols at its edges do not."""
    return unicodedata.category(ch)[0] in "LNM"


@lru_cache(maxsize=1)
def _uroman():
    import uroman  # its tables load once per process (about 2 s)
    return uroman.Uroman()


def romanize(text: str) -> str:
    """uroman's romanization of `text`, lower-cased."""
    return _uroman().romanize_string(text).lower()


def split_words(text: str, alphabet: frozenset[str]) -> list[Word]:
    """The words of `text` in order, with offsets into it and their letters from `alphabet`."""
    words = []
    for m in _SPLIT.finditer(text):
        begin, end = m.span()
        if not _PER_CHAR.fullmatch(m.group()):
            while begin < end and not _is_core(text[begin]):
                begin += 1
            while end > begin and not _is_core(text[end - 1]):
                end -= 1
            if begin == end:
                continue
        piece = text[begin:end]
        words.append(Word(piece, begin, end, "".join(c for c in romanize(piece) if c in alphabet)))
    return words


__all__ = ["Word", "romanize", "split_words"]
