"""Sentence splitting of normalized text into LM-sized segments (the official `split_paragraph` rules).

1. Append a final `。` (zh) / `.` (en) when the text does not end in sentence punctuation.
2. Cut after each sentence end; a closing quote right after it stays with its sentence. A mark that
   directly follows another one is dropped (official behaviour: `.;` -> `.`).
3. Merge sentences greedily: close the running segment only when adding the next sentence would pass
   `max_len` AND the segment is already longer than `min_len`.
4. A last segment shorter than `merge_len` joins the previous one.
Lengths are characters for zh and tokenizer tokens for en (the caller passes the measure).
"""
from __future__ import annotations

import unicodedata
from typing import Callable

__all__ = ["ZH_SENTENCE_ENDS", "EN_SENTENCE_ENDS", "split_paragraph", "is_only_punctuation"]

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
