"""Where each normalized segment came from in the caller's ORIGINAL text (sentence timings' begin_index/end_index).

    spans = segment_spans("今天是2024年5月20日。天气很好！", ["今天是二零二四年五月二十日。", "天气很好！"])
    # [(0, 14), (14, 19)]

The normalizer rewrites numbers, dates and symbols, drops symbols and blanks, and the splitter may add a final
full stop or drop a doubled mark; `fit_context` may cut a segment further. The segments, joined, are aligned
to the original text (difflib's SequenceMatcher, no junk heuristic): unchanged characters map one to one, a
rewritten region ("2024" -> "two thousand twenty four") maps region to region. A boundary between two segments
maps to one place of the original, so consecutive segments get consecutive spans that never overlap and
together cover the text: a boundary inside a rewritten region goes to its nearer end, original text the
normalizer dropped at a boundary (an emoji, a punctuation-only sentence) stays with the segment before it.
Each span then leaves out its own leading and trailing blanks.

The alignment goes boundary by boundary, each from the last one's place, over one segment and WINDOW
characters after it: the cost stays linear in the text's length whatever it holds.
"""
from __future__ import annotations

from collections.abc import Sequence
from difflib import SequenceMatcher

__all__ = ["segment_spans", "strip_prefix"]

# characters past a boundary that its alignment sees in each text (the rewrites and drops around it)
WINDOW = 200


def strip_prefix(segments: Sequence[str], prefix: str) -> list[str]:
    """`segments` without `prefix` where they start with it (CosyVoice3's system prompt in cross_lingual text,
    which every piece that `fit_context` cuts keeps)."""
    return [s[len(prefix):] if prefix and s.startswith(prefix) else s for s in segments]


def segment_spans(original: str, segments: Sequence[str]) -> list[tuple[int, int]]:
    """(begin, end) of each segment in `original` (end exclusive), in order, without blanks at either end."""
    if not segments:
        return []
    bounds, pos, text = [0], 0, "".join(segments)
    start = 0
    for s in segments[:-1]:  # each boundary found from the last one: segments are consecutive in the original
        cut = start + len(s)
        a = text[start:cut + WINDOW]
        b = original[pos:pos + len(a) + WINDOW]
        pos += _position(_opcodes(a, b), cut - start)
        bounds.append(pos)
        start = cut
    bounds.append(len(original))
    return [trim(original, bounds[k], bounds[k + 1]) for k in range(len(segments))]


def _opcodes(a: str, b: str) -> list[tuple[str, int, int, int, int]]:
    return SequenceMatcher(None, a, b, autojunk=False).get_opcodes()


def _position(ops: list[tuple[str, int, int, int, int]], p: int) -> int:
    """Where position `p` of the first text lies in the second: one to one in an unchanged region, at the
    nearer end of a rewritten one; at its start, after what the second text alone has there (an insert)."""
    for tag, i1, i2, j1, j2 in ops:
        if i1 <= p < i2:
            if tag == "equal":
                return j1 + p - i1
            return j1 if p - i1 <= i2 - p else j2
    return ops[-1][4] if ops else 0


def trim(text: str, begin: int, end: int) -> tuple[int, int]:
    """[begin, end) without blanks at either end."""
    while begin < end and text[begin].isspace():
        begin += 1
    while end > begin and text[end - 1].isspace():
        end -= 1
    return begin, end
