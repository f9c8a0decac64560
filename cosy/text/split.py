"""Sentence splitting of normalized text into LM-sized segments (the official `split_paragraph` rules).

1. Append a final `。` (zh) / `.` (en) when the text does not end in sentence punctuation.
2. Cut after each sentence end; a closing quote right after it stays with its sentence. A mark that
   directly follows another one is dropped (official behaviour: `.;` -> `.`).
3. Merge sentences greedily: close the running segment only when adding the next sentence would pass
   `max_len` AND the segment is already longer than `min_len`.
4. A last segment shorter than `merge_len` joins the previous one.
Lengths are characters for zh and tokenizer tokens for en (the caller passes the measure).

A segment that is still longer than the LM can take in one call (one sentence without an end) is cut further
by `split_to_fit`: not an official rule, so it never touches a segment that fits.
"""
from __future__ import annotations

import bisect
import re
import unicodedata
from typing import Callable

__all__ = ["ZH_SENTENCE_ENDS", "EN_SENTENCE_ENDS", "NoSplit", "split_paragraph", "split_to_fit",
           "is_only_punctuation"]

ZH_SENTENCE_ENDS = frozenset("。？！；：、.?!;")
EN_SENTENCE_ENDS = frozenset(".?!;:")
CLOSING_QUOTES = frozenset('"”')
MAX_LEN, MIN_LEN, MERGE_LEN = 80, 60, 20


def is_only_punctuation(text: str) -> bool:
    """True when every character is punctuation or a symbol (Unicode P* / S*), or the text is empty.

    Same as the official `regex.fullmatch(r'^[\\p{P}\\p{S}]*$', text)`; emoji are symbols (So).
    """
    return all(unicodedata.category(c)[0] in "PS" for c in text)


def _sentences(text: str, ends: frozenset[str]) -> list[str]:
    """Cut `text` (which ends in a mark from `ends`) after every mark, keeping closing quotes attached."""
    pieces: list[str] = []
    start = 0
    for i, c in enumerate(text):
        if c not in ends:
            continue
        if i > start:
            pieces.append(text[start:i + 1])
        if i + 1 < len(text) and text[i + 1] in CLOSING_QUOTES:
            if pieces:  # the quote closes the last sentence (the official code crashes when there is none)
                pieces[-1] += text[i + 1]
                start = i + 2
            else:
                start = i + 1
        else:
            start = i + 1
    return pieces


def split_paragraph(text: str, lang: str, length: Callable[[str], int] | None = None,
                    max_len: int = MAX_LEN, min_len: int = MIN_LEN, merge_len: int = MERGE_LEN) -> list[str]:
    """Split normalized `text` into segments. `lang` is "zh" or "en"; `length` measures en text in tokens.

    zh measures characters whatever `length` is. An empty text gives [].
    """
    if lang not in ("zh", "en"):
        raise ValueError(f"lang must be 'zh' or 'en', not {lang!r}")
    if lang == "zh" or length is None:
        length = len
    ends = ZH_SENTENCE_ENDS if lang == "zh" else EN_SENTENCE_ENDS
    if not text:
        return []
    if text[-1] not in ends:
        text += "。" if lang == "zh" else "."

    segments: list[str] = []
    current = ""
    for sentence in _sentences(text, ends):
        if length(current + sentence) > max_len and length(current) > min_len:
            segments.append(current)
            current = ""
        current += sentence
    if current:
        if segments and length(current) < merge_len:
            segments[-1] += current
        else:
            segments.append(current)
    return segments


# `split_to_fit`'s boundaries, best first: after a sentence end (and a closing quote), after a clause mark,
# before a blank (the blank starts the next piece, so each word keeps its token), between two characters
_FIT_CUTS = (re.compile("[" + re.escape("".join(sorted(ZH_SENTENCE_ENDS | EN_SENTENCE_ENDS | set("。！？…\n")))) +
                        "]+[" + "".join(sorted(CLOSING_QUOTES)) + "]?"),
             re.compile(r"[，,、﹐､;；:：—]+"))
# a CosyVoice special token is one token: never cut inside one (<|endofprompt|>, [breath], <strong>, [ià])
_SPECIAL = re.compile(r"<\|[^|<>\s]{1,40}\|>|\[[^\[\]\s]{1,32}\]|</?[A-Za-z_]{1,16}>")


class NoSplit(ValueError):
    """No cut makes the piece `unit` (`tokens` long) fit `limit`: it is the smallest piece there is."""

    def __init__(self, unit: str, tokens: int, limit: int):
        super().__init__(f"{unit[:40]!r} is {tokens} tokens, more than the {limit} that fit")
        self.unit, self.tokens, self.limit = unit, tokens, limit


def _candidates(text: str) -> list[list[int]]:
    """The cut positions of each boundary kind, best first, each ascending (cutting at p: text[:p], text[p:])."""
    inside = bytearray(len(text) + 1)  # 1: a cut here would break a special token
    for m in _SPECIAL.finditer(text):
        inside[m.start() + 1:m.end()] = b"\x01" * (m.end() - m.start() - 1)
    levels = [[m.end() for m in pattern.finditer(text)] for pattern in _FIT_CUTS]
    levels.append([i for i in range(1, len(text)) if text[i].isspace() and not text[i - 1].isspace()])
    levels.append([i for i in range(1, len(text)) if not unicodedata.category(text[i]).startswith("M")])
    return [[p for p in level if 0 < p < len(text) and not inside[p]] for level in levels]


def _cut(text: str, start: int, stop: int, length: Callable[[str], int], limit: int, target: int,
         levels: list[list[int]]) -> int:
    """The end of the next piece from `start` (a cut at most `stop`, past which nothing fits): at the best
    boundary kind that has a fitting cut, the cut whose piece is nearest `target` tokens (never over `limit`).
    NoSplit when no cut fits."""
    for level in levels:
        lo, hi = bisect.bisect_right(level, start), bisect.bisect_right(level, stop)
        if lo == hi or length(text[start:level[lo]]) > limit:
            continue
        # the last cut whose piece is at most `target` (lengths grow with the cut: bisect on them)
        a, b = lo, hi
        while b - a > 1:
            mid = (a + b) // 2
            if length(text[start:level[mid]]) <= target:
                a = mid
            else:
                b = mid
        best = a
        if a + 1 < hi:  # the next cut may be nearer the target, and still fit
            over = length(text[start:level[a + 1]])
            if over <= limit and over - target < target - length(text[start:level[a]]):
                best = a + 1
        return level[best]
    finest = levels[-1]
    at = bisect.bisect_right(finest, start)
    end = finest[at] if at < len(finest) else len(text)
    raise NoSplit(text[start:end], length(text[start:end]), limit)


def split_to_fit(text: str, length: Callable[[str], int], limit: int) -> list[str]:
    """`text` cut into consecutive pieces of at most `limit` by `length` (tokens): at sentence ends where it has
    them, else at clause marks (commas), else before blanks (between words), else between characters, never
    inside a CosyVoice special token; the pieces are about equally long. `text` itself when it fits. NoSplit
    when some piece that cannot be cut further does not fit."""
    if length(text) <= limit:
        return [text]
    if limit < 1:
        raise NoSplit(text, length(text), limit)
    levels = _candidates(text)
    pieces, start = [], 0
    window = 8 * limit + 64  # characters in which the next cut is looked for; grows if they all fit
    while start < len(text):
        while start + window < len(text) and length(text[start:start + window]) <= limit:
            window *= 2
        if start + window >= len(text):
            rest = length(text[start:])
            if rest <= limit:
                pieces.append(text[start:])
                break
            target = -(-rest // -(-rest // limit))  # equal pieces of the rest
        else:
            target = limit
        end = _cut(text, start, start + window, length, limit, target, levels)
        pieces.append(text[start:end])
        start = end
    return pieces
