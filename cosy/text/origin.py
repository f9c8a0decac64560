"""Where a rewritten text came from: a position map from a rewrite's output back to its input, so that sentence
spans (`cosy.pipeline.timing`) index the caller's ORIGINAL text whatever rewrote it before the normalizer (the
markdown filter, a language hint's readings, a lexicon or hot_fix replacement).

    origin = Origin()
    origin.same(2); origin.changed(2, 6); origin.same(2)    # "A 12 b" -> "A twelve b"
    caller_spans([(0, 8)], [origin], "A 12 b")              # [(0, 4)]: "A 12"

A map is a run of pieces, each a kept stretch (one to one) or a rewritten region (region to region: a number
read out, a markdown marker dropped, a sentence end added). A span of the output maps to the smallest input
position its begin can be (text dropped just before a sentence stays with it: a heading's `# `, a `**`) and
the largest its end can be; a boundary inside a rewritten region gives the region to the sentence before.
Rewrites in a row are a list of maps, the caller's text's first (`caller_spans` maps through them outermost
first), then each span is clipped to begin where the one before ended and trimmed of blanks.
"""
from __future__ import annotations

from collections.abc import Sequence

from cosy.text.offsets import trim

__all__ = ["Origin", "caller_span", "caller_spans"]


class Origin:
    """Pieces (out_begin, out_end, in_begin, in_end, kept) covering a rewrite's output and its input, in order;
    built as the rewrite goes (`same`, `changed`, `extend`)."""

    def __init__(self) -> None:
        self.pieces: list[tuple[int, int, int, int, bool]] = []
        self.out_len = 0
        self.in_len = 0

    @classmethod
    def identity(cls, n: int) -> "Origin":
        origin = cls()
        origin.same(n)
        return origin

    @classmethod
    def replaced(cls, n: int, replacements: Sequence[tuple[int, int, int]]) -> "Origin":
        """A text of `n` characters with regions (begin, end, new length) replaced, in order, not overlapping."""
        origin, at = cls(), 0
        for begin, end, length in replacements:
            origin.same(begin - at)
            origin.changed(end - begin, length)
            at = end
        origin.same(n - at)
        return origin

    @classmethod
    def of_positions(cls, positions: Sequence[int | None], n: int) -> "Origin":
        """From the input position of each output character (None: added by the rewrite) over an input of `n`
        characters; input skipped between them was dropped. Positions must not go back (one that does counts
        as added)."""
        origin, at = cls(), 0
        for q in positions:
            if q is None or q < at:
                origin.changed(0, 1)
                continue
            origin.changed(q - at, 0)
            origin.same(1)
            at = q + 1
        origin.changed(n - at, 0)
        return origin

    def same(self, n: int) -> None:
        """`n` characters kept."""
        if n > 0:
            self._add(n, n, True)

    def changed(self, n_in: int, n_out: int) -> None:
        """`n_in` characters of the input became `n_out` of the output (0: dropped, or added when n_in is 0)."""
        if n_in > 0 or n_out > 0:
            self._add(n_in, n_out, False)

    def extend(self, other: "Origin") -> None:
        """`other`'s pieces after this map's (the rewrite of the input that follows)."""
        for o0, o1, i0, i1, kept in other.pieces:
            self._add(i1 - i0, o1 - o0, kept)

    def _add(self, n_in: int, n_out: int, kept: bool) -> None:
        o, i = self.out_len, self.in_len
        if self.pieces and self.pieces[-1][4] == kept:  # (adjacent pieces of one kind are one)
            o0, _, i0, _, _ = self.pieces.pop()
            self.pieces.append((o0, o + n_out, i0, i + n_in, kept))
        else:
            self.pieces.append((o, o + n_out, i, i + n_in, kept))
        self.out_len, self.in_len = o + n_out, i + n_in

    def begin(self, p: int) -> int:
        """The smallest input position output position `p` can be (a sentence's begin)."""
        for o0, o1, i0, i1, kept in self.pieces:  # (a piece whose output ends at p lies before it)
            if o0 <= p < o1 or o0 == o1 == p:
                return i0 + (p - o0) if kept else i0
        return self.in_len

    def end(self, p: int) -> int:
        """The largest input position output position `p` can be (a sentence's end)."""
        for o0, o1, i0, i1, kept in reversed(self.pieces):
            if o0 < p <= o1 or o0 == o1 == p:
                return i0 + (p - o0) if kept else i1
        return 0


def caller_span(begin: int, end: int, origins: Sequence[Origin], floor: int = 0) -> tuple[int, int]:
    """[begin, end) of the last rewrite's output as a span of the first one's input (`origins`: the caller's
    text's map first), beginning no earlier than `floor` (where the sentence before ended)."""
    for origin in reversed(origins):
        begin, end = origin.begin(begin), (origin.end(end) if end > begin else origin.begin(begin))
    begin = max(begin, floor)
    return begin, max(begin, end)


def caller_spans(spans: Sequence[tuple[int, int]], origins: Sequence[Origin],
                 text: str) -> list[tuple[int, int]]:
    """Consecutive sentences' spans of the rewritten text as spans of `text` (the caller's): in order, never
    overlapping, each without blanks at its ends."""
    out, floor = [], 0
    for begin, end in spans:
        begin, floor = caller_span(begin, end, origins, floor)
        out.append(trim(text, begin, floor))
    return out
