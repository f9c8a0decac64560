"""Sentence marks of a duplex synthesis (`Engine.synthesize_duplex`): where each LM segment lies in the audio
and in the text the caller streamed.

Several segments share one streaming token2wav (`cosy.pipeline.duplex.token_streams`), so a sentence boundary can
fall inside an audio chunk. Its place is computed from the speech tokens before it: the flow makes
`token_mel_ratio` mel frames per token, the speed control stretches frame j of the output from input position
(j + 0.5) * speed - 0.5 (`cosy.pipeline.speed.MelStretcher`), and HiFT makes `samples_per_frame` samples per
frame, sample t belonging to frame t // samples_per_frame (both streaming vocoders). So a segment that starts
after k tokens of its stream starts at output frame ceil(ratio * k / speed - 1/2): at speed 1 exactly the
first frame of its first token; otherwise the first frame interpolated at or past the boundary (it mixes
the two sentences' frames, the one before it leans on the earlier one). A stream's last sentence ends at the
stream's last sample. A chunk that holds a boundary is cut there (the same samples, in two pieces), so each
chunk belongs to one sentence and marks come between chunks: "begin" before a sentence's first chunk, "end"
after its last.

Offsets index the caller's text: the pieces as sent, joined (`CallerText`), through the maps of the text controls
that rewrote them (markdown, a language hint: `cosy.text.origin`). Each LM text id carries the span
of the caller's text its part came from (`cosy.text.offsets.segment_spans` over a released run, shared by
the part's ids in proportion where a segment is cut inside a part). While a sentence is being spoken its
text may still be arriving: a "begin" mark holds what the LM had read of it, the "end" mark all of it.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from fractions import Fraction
from typing import Any

from torch import Tensor

from cosy.pipeline.timing import SentenceMark, SentenceTiming
from cosy.text.offsets import trim
from cosy.text.origin import Origin, caller_span


class CallerText:
    """The caller's text pieces as they are read (`record`), joined on demand; `origins`: the maps from the
    text the LM reads back to them, when a text control rewrote it (`cosy.text.control.streamed_text`)."""

    def __init__(self) -> None:
        self._pieces: list[str] = []
        self._joined = ""
        self.origins: list[Origin] = []

    def record(self, pieces: Iterable[str]) -> Iterator[str]:
        for piece in pieces:
            self._pieces.append(piece)
            yield piece

    def span(self, begin: int, end: int, floor: int = 0) -> tuple[int, int, str]:
        """(begin, end, text) of the caller's text that [begin, end) of the text read came from, beginning no
        earlier than `floor` (where the sentence before ended), without blanks at either end."""
        begin, end = caller_span(begin, end, self.origins, floor)
        if len(self._joined) < end:
            self._joined = "".join(self._pieces)
        begin, end = trim(self._joined, begin, end)
        return begin, end, self._joined[begin:end]


class Segment:
    """One LM segment of the streamed text: yields its ids one at a time ([id], as bistream takes them) and
    keeps the span of the caller's text they came from."""

    def __init__(self, ids: Iterator[tuple[int, int, int]]):
        self._ids = ids  # (id, begin, end) with the caller's text span of each
        self.begin: int | None = None
        self.end = 0

    def __iter__(self) -> Iterator[list[int]]:
        for token, begin, end in self._ids:
            if self.begin is None:
                self.begin = begin
            self.end = max(self.end, end)
            yield [token]


class _Open:
    """A segment in the current stream: its first sample (absolute), once its tokens started."""

    def __init__(self, index: int, begin: int):
        self.index, self.begin = index, begin


class DuplexMarks:
    """Tracks a duplex request's segments through its token2wav streams and cuts its chunks at their
    boundaries, calling `emit` with each mark (nothing when it is None: the chunks are cut all the same, so
    asking for marks changes no chunk)."""

    def __init__(self, t2w: Any, speed: float, text: CallerText,
                 emit: Callable[[SentenceMark], None] | None = None):
        self.ratio = t2w.flow.cfg.token_mel_ratio
        self.spf = t2w.samples_per_frame
        self.rate = t2w.sample_rate
        self.speed = speed
        self.text, self.emit = text, emit
        self.segments: dict[int, Segment] = {}
        self.out = 0  # samples yielded so far
        self.stream_start = 0
        self.waiting: list[_Open] = []  # started in this stream, not begun in the audio yet (in order)
        self.current: _Open | None = None  # the sentence being spoken
        self.floor = 0  # where the last sentence ended in the caller's text (the next one begins there or later)

    def segment(self, index: int, segment: Segment) -> Segment:
        self.segments[index] = segment
        return segment

    def new_stream(self) -> None:
        self.stream_start = self.out

    def started(self, index: int, tokens_before: int) -> None:
        """Segment `index` takes the current stream's tokens from `tokens_before` on."""
        self.waiting.append(_Open(index, self.stream_start + self.frame(tokens_before) * self.spf))

    def frame(self, tokens: int) -> int:
        """The output frame where the audio of the token at `tokens` of a stream begins (module docstring)."""
        if self.speed == 1.0:
            return self.ratio * tokens
        return math.ceil(Fraction(self.ratio * tokens) / Fraction(self.speed) - Fraction(1, 2))

    def cut(self, chunk: Tensor) -> Iterator[Tensor]:
        """`chunk` in pieces at the sentence boundaries inside it, the marks between them."""
        start, done = self.out, 0
        end = start + chunk.numel()
        while self.waiting and self.waiting[0].begin < end:
            at = max(self.waiting[0].begin - start, done)
            if at > done:
                self.out = start + at
                yield chunk[done:at]
                done = at
            self._next(self.waiting.pop(0))
        if done < chunk.numel():
            self.out = end
            yield chunk[done:]

    def end_stream(self) -> None:
        """The stream's audio is all out: its last sentence ends here (and any still waiting, empty)."""
        while self.waiting:
            self._next(self.waiting.pop(0))
        self._close()

    def _next(self, segment: _Open) -> None:
        self._close()
        segment.begin = self.out  # (at its computed place, or the stream's end: the sentences tile the audio)
        self.current = segment
        self._mark("begin", segment, None)

    def _close(self) -> None:
        if self.current is not None:
            self._mark("end", self.current, self.out)
            self.current = None

    def _mark(self, kind: str, segment: _Open, end_sample: int | None) -> None:
        if self.emit is None:
            return
        seg = self.segments.get(segment.index)
        first = seg.begin if seg is not None and seg.begin is not None else 0
        begin, end, text = self.text.span(first, max(first, seg.end if seg is not None else 0), self.floor)
        if kind == "end":
            self.floor = end
        self.emit(SentenceMark(kind, SentenceTiming(segment.index, text, begin, end, segment.begin, end_sample,
                                                    self.rate)))


__all__ = ["CallerText", "DuplexMarks", "Segment"]
