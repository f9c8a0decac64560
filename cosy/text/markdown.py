"""Markdown as what a listener should hear (`enable_markdown_filter`, the managed service's name): an LLM's answer
spoken without its asterisks, hashes, pipes and link targets.

    to_speech("# Title\\n\\nSome **bold** [link](http://x) text.")   # "Title. Some bold link text."
    stream = MarkdownStream()                                       # the duplex sockets: text in pieces
    stream.feed("- one\\n- tw") + stream.feed("o\\n") + stream.finish()

A real parser (markdown-it-py, CommonMark with GFM tables and strikethrough) reads the text; each block becomes
a sentence of its own, the blocks joined by blanks (as a person writes the same words): headings, paragraphs,
list items and table rows end in a sentence end (。 for Chinese text, "." otherwise) when they do not end in
punctuation already; a table's cells are joined by commas; emphasis and strikethrough leave their text, a
link its text (a bare URL stays), an image its alt text, inline code its text; code blocks, HTML and rules
are left out (nothing a listener can use). Text without markdown comes out as it went in, but for line
breaks inside a paragraph (blanks).

Streaming (`MarkdownStream`): text is released block by block as soon as a block is surely complete (after a
blank line, a heading line, a closing code fence, or a line followed by one that starts a list item or heading),
never waiting for the end of the text for complete blocks; an unfinished line is held back. The pieces' speech,
joined, is the whole text's speech (`to_speech`).
"""
from __future__ import annotations

import re
import unicodedata

from markdown_it import MarkdownIt
from markdown_it.token import Token

from cosy.text.normalize import contains_chinese

__all__ = ["to_speech", "MarkdownStream"]

_PARSER = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r" {0,3}#{1,6}(?:\s|$)")
# what interrupts a paragraph (CommonMark): a bullet item, a heading, a fence; an ordered item only after an item
_STARTS_BLOCK = re.compile(r" {0,3}(?:[-*+]\s+\S|#{1,6}(?:\s|$)|`{3,}|~{3,})")
_ITEM = re.compile(r" {0,3}(?:[-*+]|\d{1,9}[.)])\s")


def _inline(token: Token) -> str:
    """The words of an inline token: text, code's text, image alt text; breaks as blanks; HTML left out."""
    out = []
    for child in token.children or ():
        if child.type in ("text", "code_inline"):
            out.append(child.content)
        elif child.type == "image":
            out.append(_inline(child) if child.children else child.content)
        elif child.type in ("softbreak", "hardbreak"):
            out.append(" ")
    return "".join(out).strip()


def _ended(line: str) -> str:
    """`line` ending in punctuation: a sentence end added when it ends in a letter or digit."""
    line = line.strip()
    if not line or unicodedata.category(line[-1])[0] in "PS":
        return line
    return line + ("。" if contains_chinese(line) else ".")


def to_speech(text: str) -> str:
    """The words of a markdown text, block after block (see the module doc). Never raises for any text."""
    lines: list[str] = []
    row: list[str] | None = None  # the cells of the table row being read
    for token in _PARSER.parse(text):  # code blocks, HTML blocks and rules hold no inline token: left out
        if token.type == "tr_open":
            row = []
        elif token.type == "tr_close" and row is not None:
            cells = [c for c in row if c]
            if cells:
                lines.append(_ended(("，" if contains_chinese("".join(cells)) else ", ").join(cells)))
            row = None
        elif token.type == "inline":
            words = _inline(token)
            if row is not None:
                row.append(words)
            elif words:
                lines.append(_ended(words))
    return " ".join(lines)


class MarkdownStream:
    """Markdown arriving in pieces, released as speech block by block (see the module doc)."""

    def __init__(self):
        self._held = ""

    def feed(self, piece: str) -> str:
        """The speech of the blocks that `piece` completes ("" when none is complete yet)."""
        self._held += piece
        cut = _complete(self._held)
        if not cut:
            return ""
        done, self._held = self._held[:cut], self._held[cut:]
        speech = to_speech(done)
        return speech + " " if speech else ""

    def finish(self) -> str:
        """The speech of what is held (the text's end closes every block)."""
        done, self._held = self._held, ""
        return to_speech(done)


def _complete(text: str) -> int:
    """How much of `text` is complete blocks: the end of the last line after which a block surely ends."""
    lines = text.split("\n")[:-1]  # the last one is unfinished (or empty after a final newline)
    cut, at, fence = 0, 0, None
    for i, line in enumerate(lines):
        at += len(line) + 1
        m = _FENCE.match(line)
        if fence is not None:
            if m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and not line[m.end():].strip():
                fence = None
                cut = at
            continue
        if m:
            fence = m.group(1)
            continue
        following = lines[i + 1] if i + 1 < len(lines) else text[at:] if text[at:].strip() else None
        if not line.strip() or _HEADING.match(line):
            cut = at
        elif following is not None and "|" not in line and (
                _STARTS_BLOCK.match(following) or _ITEM.match(following) and _ITEM.match(line)):
            cut = at  # the next line starts a list item, heading or fence: this line's block has ended
    return cut
