"""A request's text controls before the text frontend: the markdown filter (`cosy.text.markdown`) and a language
hint's readings (`cosy.text.language.localize`), for a whole text and for text arriving in pieces (the duplex
sockets). Markdown is filtered first (its speech is plain text), then its numbers are read in the hint's language.
"""
from __future__ import annotations

import re
from typing import Iterable, Iterator

from cosy.text.language import LOCAL_LANGUAGES, localize
from cosy.text.markdown import MarkdownStream, to_speech

__all__ = ["plain_text", "streamed_text"]

_LAST_BLANK = re.compile(r"\s(?=\S*$)")


def plain_text(text: str, language: str | None = None, markdown: bool = False) -> str:
    """`text` as the frontend should read it: markdown filtered (`markdown`), numbers read in `language`."""
    if markdown:
        text = to_speech(text)
    return localize(text, language)


def streamed_text(pieces: Iterable[str], language: str | None = None, markdown: bool = False) -> Iterator[str]:
    """`pieces` with the same controls, released as soon as they are sure: markdown block by block
    (`MarkdownStream`), a hint's readings up to the last blank (a number may go on in the next piece)."""
    if not markdown and language not in LOCAL_LANGUAGES:
        yield from pieces
        return
    stream = MarkdownStream() if markdown else None
    held = ""
    for piece in pieces:
        text = held + (stream.feed(piece) if stream else piece)
        m = _LAST_BLANK.search(text) if language in LOCAL_LANGUAGES else None
        cut = m.end() if m else (0 if language in LOCAL_LANGUAGES else len(text))
        held = text[cut:]
        if text[:cut]:
            yield localize(text[:cut], language)
    rest = held + (stream.finish() if stream else "")
    if rest:
        yield localize(rest, language)
