"""Word timings in the worker: each finished sentence's `words` filled from its audio before its "end" mark
goes out (`cosy.pipeline.timing`: the engine marks a sentence "begin" before its first chunk and "end" after
its last).

    engine.synthesize = with_words(engine.synthesize, Aligner.load(model_dir, device))

After that, a request with `word_timestamps` gets its marks through `SentenceWords`; every other request runs
exactly as before (no audio kept, no alignment).
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import numpy as np

from cosy.align.aligner import Aligner, fill_words
from cosy.pipeline.timing import SentenceMark


class SentenceWords:
    """One request's chunks and marks: keeps the audio of the sentences still being spoken (from the
    earliest open sentence's first sample), and on a sentence's "end" aligns its samples with its text and
    sets its words before passing the mark on to `send`."""

    def __init__(self, aligner: Aligner, send: Callable[[SentenceMark], None]):
        self.aligner = aligner
        self.send = send
        self.chunks: list[np.ndarray] = []
        self.kept_from = 0  # the stream sample the first kept chunk starts at
        self.total = 0  # samples seen so far
        self.open: dict[int, int] = {}  # sentence index -> begin_sample of the sentences begun, not ended

    def chunk(self, audio) -> None:
        """A chunk of the stream's output, in order (torch or numpy, any shape: flattened)."""
        a = np.asarray(audio.numpy() if hasattr(audio, "numpy") else audio, dtype=np.float32).reshape(-1)
        if self.open:
            self.chunks.append(a)
        else:  # nothing to align: keep nothing
            self.kept_from = self.total + a.size
        self.total += a.size

    def mark(self, mark: SentenceMark) -> None:
        s = mark.sentence
        if mark.kind == "begin":
            if not self.open:
                self.chunks, self.kept_from = [], self.total
            self.open[s.index] = s.begin_sample
        elif mark.kind == "end" and s.end_sample is not None:
            self.open.pop(s.index, None)
            kept = np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)
            lo, hi = s.begin_sample - self.kept_from, s.end_sample - self.kept_from
            fill_words(self.aligner, s, kept[max(lo, 0):max(hi, 0)])
            self._drop_before(min(self.open.values(), default=self.total))
        self.send(mark)

    def _drop_before(self, sample: int) -> None:
        kept = np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32)
        cut = min(max(sample - self.kept_from, 0), kept.size)
        self.chunks = [kept[cut:]] if cut < kept.size else []
        self.kept_from += cut

    def wrap(self, chunks: Iterator) -> Iterator:
        """The chunks unchanged, each seen by `chunk` before it is passed on; closing this closes them."""
        try:
            for c in chunks:
                self.chunk(c)
                yield c
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()


def with_words(synthesize: Callable, aligner: Aligner) -> Callable:
    """`Engine.synthesize` that fills the words of a `word_timestamps` request's sentences (`SentenceWords`)
    before each "end" mark reaches its `on_mark`."""

    @functools.wraps(synthesize)
    def run(req, *args, on_mark: Callable[[SentenceMark], None] | None = None, **kwargs):
        if on_mark is None or not getattr(req, "word_timestamps", False):
            return synthesize(req, *args, on_mark=on_mark, **kwargs)
        words = SentenceWords(aligner, on_mark)
        return words.wrap(synthesize(req, *args, on_mark=words.mark, **kwargs))

    return run


__all__ = ["SentenceWords", "with_words"]
