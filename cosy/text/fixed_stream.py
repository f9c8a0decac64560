"""Pronunciation fixes (`cosy.text.lexicon`) on text that arrives in pieces (a duplex request's stream).

    for run in fixed_released(frontend, ["去重", "庆玩"], fixes):   # "去", "[ch][óng][q][ìng]", "玩"
        ids = frontend.encode(run.normalized)

As `cosy.text.stream.stream_released`, with the fixes applied first: text that could still become part of a
fixed word (a suffix that begins one of the words, or a match that reaches into such a suffix) is held back
until the next piece decides it, so a word split across pieces is matched as if it came whole. A
pronunciation goes out as its phoneme tokens, never through the normalizer (which would break them), a
replacement normalized on its own; the text between them is normalized as a stream is. Each released run
keeps its span of the caller's text (a fixed word's: the word as written).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

from cosy.text.frontend import TextFrontend
from cosy.text.lexicon import Entry, find
from cosy.text.ssml_text import phoneme_tag
from cosy.text.stream import _normalized, split_tail


class Released(NamedTuple):
    """A run of the caller's text released to the LM, and what it became (the fields of
    `cosy.text.stream.stream_released`'s runs)."""

    begin: int  # character offsets into the pieces joined as sent, end exclusive
    end: int
    raw: str  # the caller's text of it
    normalized: str  # normalized text or phoneme tokens, never empty


def fixed_released(frontend: TextFrontend, pieces: Iterable[str], fixes: Sequence[Entry]) -> Iterator[Released]:
    """Released runs (normalized text or phoneme tokens, never empty) as the raw pieces arrive."""
    prefixes = {e.word[:n] for e in fixes for n in range(1, len(e.word) + 1)}
    longest = max((len(e.word) for e in fixes), default=0)
    caller = ""  # the pieces joined as sent
    held = 0  # where the raw text not yet matched begins
    tail = held  # where the text not yet normalized (a Latin tail) begins

    def release(upto: int, spans: list) -> Iterator[Released]:
        nonlocal tail
        at = held
        for start, end, entry in [(held + s, held + e, x) for s, e, x in spans] + [(upto, upto, None)]:
            if start > at:  # text between fixed words: normalized as a stream is
                ready, _ = split_tail(caller[tail:start])
                cut = tail + len(ready)
                if out := _normalized(frontend, ready):
                    yield Released(tail, cut, ready, out)
                tail = cut
            if entry is None:
                return
            blank = caller[tail:start]  # a held-back tail: flushed first (only blanks join the fixed word)
            if blank.strip() and (out := _normalized(frontend, blank)):
                yield Released(tail, start, blank, out)
            lead = blank if not blank.strip() else ""
            out = (_normalized(frontend, lead + entry.value) if entry.kind == "sub"
                   else "".join(phoneme_tag(p, entry.kind) for p in entry.phones))
            if out:
                yield Released(tail, end, caller[tail:end], out)
            tail = at = end

    for piece in pieces:
        caller += piece
        text = caller[held:]
        spans = find(text, fixes, caller[held - 1] if held else "")
        cut = _undecided(text, prefixes, longest, spans)
        if cut:
            yield from release(held + cut, [s for s in spans if s[1] <= cut])
            held += cut
    yield from release(len(caller), find(caller[held:], fixes, caller[held - 1] if held else ""))
    if out := _normalized(frontend, caller[tail:]):
        yield Released(tail, len(caller), caller[tail:], out)


def _undecided(held: str, prefixes: set[str], longest: int, spans: list) -> int:
    """Where the part of `held` that more text could still change begins (len(held): none of it): the first
    suffix that begins a word, or a match (`spans`) that reaches into it."""
    cut = next((s for s in range(max(0, len(held) - longest), len(held)) if held[s:] in prefixes), len(held))
    for start, end, _ in reversed(spans):
        if start < cut < end:
            cut = start
    return cut


__all__ = ["fixed_released"]
