"""Subtitle files (SRT, WebVTT) from sentence timings: one cue per sentence, showing the caller's own text of it
from its first to its last sample (ms, `cosy.pipeline.timing.SentenceTiming`). Written by pysubs2.

    text = subtitles(result.sentences, "vtt")
    fmt = subtitle_format("out.srt")   # "srt"; ValueError for another extension

A sentence's text keeps its line breaks (blank lines, which would end a cue, are left out); WebVTT escapes
`&`, `<` and `>`, which its cue text reserves for markup (SRT players read the text as it is).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pysubs2

from cosy.pipeline.timing import SentenceTiming

__all__ = ["FORMATS", "subtitle_format", "subtitles"]

FORMATS = ("srt", "vtt")
_VTT_ESCAPES = (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"))


def subtitle_format(path: str | Path) -> str:
    """The format a subtitle file's extension names ("srt" or "vtt"); ValueError for any other."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in FORMATS:
        raise ValueError(f"{str(path)!r} names no subtitle format: end it in .srt or .vtt")
    return fmt


def subtitles(sentences: Sequence[SentenceTiming], fmt: str) -> str:
    """The text of a subtitle file in `fmt` ("srt" or "vtt"): one cue per sentence with text, in order."""
    if fmt not in FORMATS:
        raise ValueError(f"subtitle format {fmt!r}: use one of {', '.join(FORMATS)}")
    doc = pysubs2.SSAFile()
    for s in sentences:
        lines = [line.strip() for line in s.text.splitlines() if line.strip()]
        if not lines or s.end_time is None:
            continue
        text = "\n".join(lines)
        if fmt == "vtt":
            for char, entity in _VTT_ESCAPES:
                text = text.replace(char, entity)
        event = pysubs2.SSAEvent(start=s.begin_time, end=s.end_time)
        event.plaintext = text
        doc.append(event)
    return doc.to_string(fmt)
