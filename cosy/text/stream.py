"""Text that arrives in pieces (an LLM's token stream), normalized without breaking words or numbers.

    for text in stream_pieces(frontend, ["今天是20", "24年5月", "20日。"]):   # "今天是", "二零二四年五月二十日。"
        ids = frontend.encode(text)

A piece's trailing run of ASCII letters, digits and number punctuation (with the whitespace before it) is
held back until the next piece shows where it ends, so "20" + "24" is normalized as "2024" and "hel" + "lo"
as "hello". What is released is normalized on its own (`TextFrontend.normalize(split=False)`); a released
Latin piece that began with a space keeps one, so words stay apart for the tokenizer.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

from cosy.text.frontend import TextFrontend
from cosy.text.normalize import contains_chinese
from cosy.text.split import CLOSING_QUOTES

_TAIL_CHARS = frozenset("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz'.,:%/-")  # may continue


def split_tail(text: str) -> tuple[str, str]:
    """(what can be normalized now, the tail to hold back: the trailing run of _TAIL_CHARS and the blanks
    before it), found from the end (a regex search from every start is quadratic in a long run)."""
    cut = len(text)
    while cut and text[cut - 1] in _TAIL_CHARS:
        cut -= 1
    while cut and text[cut - 1].isspace():
        cut -= 1
    return text[:cut], text[cut:]


def stream_pieces(frontend: TextFrontend, pieces: Iterable[str]) -> Iterator[str]:
    """Normalized text pieces (never empty) as the raw pieces arrive; the held-back tail at the end."""
    for released in stream_released(frontend, pieces):
        yield released.normalized


class Released(NamedTuple):
    """A run of the caller's text released to the normalizer, and what it became."""

    begin: int  # character offsets into the concatenation of the raw pieces, end exclusive
    end: int
    raw: str  # the caller's text of it: that concatenation[begin:end]
    normalized: str  # never empty


def stream_released(frontend: TextFrontend, pieces: Iterable[str]) -> Iterator[Released]:
    """`stream_pieces` with where each normalized piece came from in the caller's text (the raw pieces joined
    as sent): consecutive runs, blanks-only runs left out."""
    held, start = "", 0  # `held` begins at offset `start` of the joined pieces
    for piece in pieces:
        ready, held = split_tail(held + piece)
        if out := _normalized(frontend, ready):
            yield Released(start, start + len(ready), ready, out)
        start += len(ready)
    if out := _normalized(frontend, held):
        yield Released(start, start + len(held), held, out)


def _normalized(frontend: TextFrontend, text: str) -> str:
    if not text.strip():
        return ""
    out = frontend.normalize(text, split=False)[0]
    if out and text[:1].isspace() and not contains_chinese(out):
        out = " " + out
    return out


# where a duplex text closes an LM segment: the strong sentence ends (not the official split's 、：, which cut
# lists and clauses into fragments too short for natural speech)
SEGMENT_ENDS = frozenset("。？！；.?!;")


def sentence_parts(text: str) -> list[tuple[str, bool]]:
    """`text` cut after each run of sentence end marks (SEGMENT_ENDS) and the closing quotes right after it:
    (part, whether it ends a sentence), in order; "" gives []."""
    parts, start, i = [], 0, 0
    while i < len(text):
        if text[i] in SEGMENT_ENDS:
            while i < len(text) and (text[i] in SEGMENT_ENDS or text[i] in CLOSING_QUOTES):
                i += 1
            parts.append((text[start:i], True))
            start = i
        else:
            i += 1
    if start < len(text):
        parts.append((text[start:], False))
    return parts


__all__ = ["SEGMENT_ENDS", "Released", "sentence_parts", "split_tail", "stream_pieces", "stream_released"]
