"""Text that arrives in pieces (an LLM's token stream), normalized without breaking words or numbers.

    for text in stream_pieces(frontend, ["今天是20", "24年5月", "20日。"]):   # "今天是", "二零二四年五月二十日。"
        ids = frontend.encode(text)

A piece's trailing run of ASCII letters, digits and number punctuation (with the whitespace before it) is
held back until the next piece shows where it ends, so "20" + "24" is normalized as "2024" and "hel" + "lo"
as "hello". What is released is normalized on its own (`TextFrontend.normalize(split=False)`); a released
Latin piece that began with a space keeps one, so words stay apart for the tokenizer.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

from cosy.text.frontend import TextFrontend
from cosy.text.normalize import contains_chinese

_TAIL = re.compile(r"\s*[0-9A-Za-z'.,:%/\-]*$")  # what may continue in the next piece


def split_tail(text: str) -> tuple[str, str]:
    """(what can be normalized now, the tail to hold back)."""
    cut = _TAIL.search(text).start()
    return text[:cut], text[cut:]


def stream_pieces(frontend: TextFrontend, pieces: Iterable[str]) -> Iterator[str]:
    """Normalized text pieces (never empty) as the raw pieces arrive; the held-back tail at the end."""
    held = ""
    for piece in pieces:
        ready, held = split_tail(held + piece)
        if out := _normalized(frontend, ready):
            yield out
    if out := _normalized(frontend, held):
        yield out


def _normalized(frontend: TextFrontend, text: str) -> str:
    if not text.strip():
        return ""
    out = frontend.normalize(text, split=False)[0]
    if out and text[:1].isspace() and not contains_chinese(out):
        out = " " + out
    return out


__all__ = ["split_tail", "stream_pieces"]
