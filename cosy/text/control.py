"""A request's text controls before the text frontend: the markdown filter (`cosy.text.markdown`) and a language
hint's readings (`cosy.text.language.localize`), for a whole text and for text arriving in pieces (the duplex
sockets). Markdown is filtered first (its speech is plain text), then its numbers are read in the hint's language.
"""
from __future__ import annotations

import re
from typing import Iterable, Iterator

from cosy.text.language import LOCAL_LANGUAGES, localize_origin
from cosy.text.markdown import MarkdownStream, to_speech_origin
from cosy.text.origin import Origin

__all__ = ["plain_text", "plain_text_origin", "streamed_text"]

_LAST_BLANK = re.compile(r"\s(?=\S*$)")


def plain_text(text: str, language: str | None = None, markdown: bool = False) -> str:
    """`text` as the frontend should read it: markdown filtered (`markdown`), numbers read in `language`."""
    return plain_text_origin(text, language, markdown)[0]


def plain_text_origin(text: str, language: str | None = None,
                      markdown: bool = False) -> tuple[str, list[Origin]]:
    """`plain_text(...)` and the maps back to `text`, its own first (`cosy.text.origin.caller_spans`)."""
    origins = []
    if markdown:
        text, origin = to_speech_origin(text)
        origins.append(origin)
    if language in LOCAL_LANGUAGES:
        text, origin = localize_origin(text, language)
        origins.append(origin)
    return text, origins


def streamed_text(pieces: Iterable[str], language: str | None = None, markdown: bool = False,
                  origins: list[Origin] | None = None) -> Iterator[str]:
    """`pieces` with the same controls, released as soon as they are sure: markdown block by block
    (`MarkdownStream`), a hint's readings up to the last blank (a number may go on in the next piece).
    `origins` (a list, empty): given the maps of the text released back to the pieces joined as sent, which
    grow as it is released (`cosy.text.origin`; nothing when no control applies)."""
    if not markdown and language not in LOCAL_LANGUAGES:
        yield from pieces
        return
    stream = MarkdownStream() if markdown else None
    read = Origin()  # the hint's readings, from the markdown's speech (or the pieces)
    if origins is not None:
        origins += ([stream.origin] if stream else []) + [read]
    held = ""

    def localized(text: str) -> str:
        said, origin = localize_origin(text, language)
        read.extend(origin)
        return said

    for piece in pieces:
        text = held + (stream.feed(piece) if stream else piece)
        m = _LAST_BLANK.search(text) if language in LOCAL_LANGUAGES else None
        cut = m.end() if m else (0 if language in LOCAL_LANGUAGES else len(text))
        held = text[cut:]
        if text[:cut]:
            yield localized(text[:cut])
    rest = held + (stream.finish() if stream else "")
    if rest:
        yield localized(rest)
