"""Duplex text into the LM and its speech into token2wav streams: the streamed text's LM segments
(`text_segments`), and consecutive segments' speech tokens as the streams one token2wav makes
(`token_streams`); `Engine.synthesize_duplex` joins them."""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

from cosy.pipeline.duplex_marks import Segment
from cosy.pipeline.request import LM_DUPLEX_SEGMENT_TOKENS, SynthesisError
from cosy.text.fixed_stream import fixed_released
from cosy.text.frontend import TextFrontend
from cosy.text.offsets import segment_spans
from cosy.text.stream import sentence_parts, stream_released


def text_segments(text: TextFrontend, pieces: Iterable[str], on_text: Callable[[str], None] | None = None,
                  fixes: tuple = ()) -> Iterator[Segment]:
    """The streamed text as LM segments, each decoded with the official bistream rules on its own (as
    the other surfaces' text is split into sentences): a segment ends after a sentence's end marks
    (`cosy.text.stream.sentence_parts`), at LM_DUPLEX_SEGMENT_TOKENS ids, or at the text's end. So a
    complete sentence is spoken at once, without waiting for more text (within a segment the speech
    follows the text by the mix ratio), and the LM's context holds one segment however long the text.
    A segment yields its ids one at a time, as the official frontend feeds bistream
    (`_extract_text_token_generator`), and keeps the span of the pieces they came from; the next
    segment is read only when the last is decoded. SynthesisError at the end if nothing speakable came."""
    ids = streamed_ids(text, pieces, on_text, fixes)
    for first in ids:
        def segment(first=first) -> Iterator[tuple[int, int, int]]:
            token, closes, begin, end = first
            n = 1
            yield token, begin, end
            while not closes and n < LM_DUPLEX_SEGMENT_TOKENS:
                token, closes, begin, end = next(ids, (None, True, 0, 0))
                if token is None:
                    return
                n += 1
                yield token, begin, end
        yield Segment(segment())


def streamed_ids(text: TextFrontend, pieces: Iterable[str], on_text: Callable[[str], None] | None = None,
                 fixes: tuple = ()) -> Iterator[tuple[int, bool, int, int]]:
    """(text id, whether it ends a sentence, begin, end) of the normalized pieces, in order, with the span
    of the pieces (joined as sent) each id came from: its part's (`segment_spans`), shared among the
    part's ids in proportion; SynthesisError at the end if nothing speakable came."""
    n = 0
    # pronunciation fixes (`req.fixes`) applied first, as the pieces arrive (`cosy.text.fixed_stream`)
    for run in fixed_released(text, pieces, fixes) if fixes else stream_released(text, pieces):
        if on_text is not None:
            on_text(run.normalized)
        parts = sentence_parts(run.normalized)
        for (part, closes), (b, e) in zip(parts, segment_spans(run.raw, [p for p, _ in parts])):
            ids = text.encode(part)
            n += len(ids)
            b, e, m = run.begin + b, run.begin + e, max(1, len(ids))
            yield from ((i, closes and k == len(ids) - 1, b + (e - b) * k // m, b + (e - b) * (k + 1) // m)
                        for k, i in enumerate(ids))
    if n == 0:
        raise SynthesisError("the text is empty: nothing to speak arrived before its end")


def token_streams(segments: Iterator[tuple[int, Iterator[int]]], fill: int,
             started: Callable[[int, int], None] | None = None) -> Iterator[tuple[int, Iterator[int]]]:
    """The speech tokens of `segments` ((index, tokens) each, in order) as consecutive token2wav streams:
    (index of the stream's first segment, its tokens). A stream ends after the segment that takes it past
    `fill` tokens (then the longest segment no longer surely fits), or after the last; a segment is never
    split. The next segment is read only when a stream goes on: a finished stream's audio is all out before
    the next text is waited for. `started(index, n)`: segment `index` takes its stream's tokens from n on."""
    segments = iter(segments)

    def stream(first: int, tokens: Iterator[int]) -> Iterator[int]:
        n = 0
        if started is not None:
            started(first, 0)
        try:
            while True:
                for token in tokens:
                    n += 1
                    yield token
                if n > fill:
                    return
                following = next(segments, None)
                if following is None:
                    return
                if started is not None:
                    started(following[0], n)
                tokens = following[1]
        finally:  # the caller went away: stop the LM of the segment being decoded
            close = getattr(tokens, "close", None)
            if close:
                close()

    for first, tokens in segments:
        yield first, stream(first, tokens)
