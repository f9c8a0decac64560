"""When each sentence (and, with an aligner, each word) is spoken: the timings every surface reports.

A sentence is one piece the pipeline synthesizes on its own (a segment of the normalized text, one LM call).
Its place in the output audio is known exactly (samples at the engine's rate, after speed control and SSML
breaks); its place in the caller's text is the span of the ORIGINAL text it came from (the normalizer
rewrites numbers, dates and symbols; subtitles show what the caller wrote). SSML: offsets into the
document's text content (`cosy.text.ssml.Ssml.text`).

The engine reports marks as it goes (`SentenceMark`): "begin" before the sentence's first audio chunk,
"end" after its last one (`end_time` known then). Turning timestamps on changes no speech token and no
audio sample: the marks are always computed, surfaces only choose to show them.

Field names are the managed CosyVoice service's (`begin_time`/`end_time` in ms, `begin_index`/`end_index`
as character offsets, end exclusive).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace


@dataclass
class WordTiming:
    """One word (Chinese: one character) of a sentence, from the forced aligner (`--aligner`)."""

    text: str  # the caller's text of it: original[begin_index:end_index]
    begin_index: int  # character offsets into the caller's text, end exclusive
    end_index: int
    begin_time: int  # ms in the output audio
    end_time: int


@dataclass
class SentenceTiming:
    """One sentence of a request, in the order spoken (`index` from 0)."""

    index: int
    text: str  # the caller's text of it: original[begin_index:end_index]
    begin_index: int  # character offsets into the caller's text (SSML: the document's text content), end exclusive
    end_index: int
    begin_sample: int  # exact place in the output audio, in samples at the engine's rate (24 kHz)
    end_sample: int | None  # None while the sentence is still being spoken (a "begin" mark)
    sample_rate: int
    words: list[WordTiming] = field(default_factory=list)

    @property
    def begin_time(self) -> int:
        """ms from the start of the output audio."""
        return round(self.begin_sample * 1000 / self.sample_rate)

    @property
    def end_time(self) -> int | None:
        return None if self.end_sample is None else round(self.end_sample * 1000 / self.sample_rate)

    def to_dict(self, words: bool = False) -> dict:
        """The managed service's shape: index, text, begin_time, end_time, begin_index, end_index (and words)."""
        out = {"index": self.index, "text": self.text, "begin_time": self.begin_time, "end_time": self.end_time,
               "begin_index": self.begin_index, "end_index": self.end_index}
        if words:
            out["words"] = [asdict(w) for w in self.words]
        return out


@dataclass
class SentenceMark:
    """A sentence begins ("begin": before its first chunk) or ends ("end": after its last chunk)."""

    kind: str  # "begin" | "end"
    sentence: SentenceTiming

    def to_wire(self) -> dict:
        """Plain data for a pipe between processes (`from_wire` reads it back)."""
        return {"kind": self.kind, "sentence": asdict(self.sentence)}

    @classmethod
    def from_wire(cls, data: dict) -> "SentenceMark":
        s = dict(data["sentence"])
        s["words"] = [WordTiming(**w) for w in s.get("words", ())]
        return cls(data["kind"], SentenceTiming(**s))


class SentenceClock:
    """The sentences of one output stream as it is made: `count` every chunk as it goes out, `begin` a sentence
    before its first chunk, `end` it after its last; each calls `on_mark` (None: nothing is reported). Samples
    are counted from the stream's start, so a sentence's begin_sample/end_sample are exact."""

    def __init__(self, text: str, sample_rate: int, on_mark: Callable[[SentenceMark], None] | None = None):
        self.text, self.sample_rate, self.on_mark = text, sample_rate, on_mark
        # the maps from the text spoken back to `text`, when a text control rewrote it (`cosy.text.origin`)
        self.origins: list = []
        self.samples = 0
        self._index = 0
        self._open: SentenceTiming | None = None

    @property
    def wanted(self) -> bool:
        """Whether anybody listens (the caller's text spans need not be computed otherwise)."""
        return self.on_mark is not None

    def count(self, samples: int) -> None:
        self.samples += samples

    def begin(self, begin_index: int, end_index: int) -> None:
        """A sentence of `text[begin_index:end_index]` starts at the current sample."""
        self._open = SentenceTiming(self._index, self.text[begin_index:end_index], begin_index, end_index,
                                    self.samples, None, self.sample_rate)
        self._index += 1
        if self.on_mark is not None:
            self.on_mark(SentenceMark("begin", self._open))

    def end(self) -> None:
        """The open sentence ends at the current sample."""
        timing, self._open = replace(self._open, end_sample=self.samples), None
        if self.on_mark is not None:
            self.on_mark(SentenceMark("end", timing))


__all__ = ["SentenceClock", "SentenceMark", "SentenceTiming", "WordTiming"]
