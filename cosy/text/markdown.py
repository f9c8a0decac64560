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
from cosy.text.origin import Origin

__all__ = ["to_speech", "to_speech_origin", "MarkdownStream"]

_PARSER = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r" {0,3}#{1,6}(?:\s|$)")
# what interrupts a paragraph (CommonMark): a bullet item, a heading, a fence; an ordered item only after an item
_STARTS_BLOCK = re.compile(r" {0,3}(?:[-*+]\s+\S|#{1,6}(?:\s|$)|`{3,}|~{3,})")
_ITEM = re.compile(r" {0,3}(?:[-*+]|\d{1,9}[.)])\s")


# a text with the input position of each character (None: added here), built up as the speech is
_Mapped = tuple[str, list]


class _Source:
    """The markdown source, to find where each piece of speech was written: a block's words are looked for in
    order in its lines (`token.map`), from where the last one was found."""

    def __init__(self, text: str):
        self.text = text
        self.lines = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", text)] + [len(text)]
        self.at = 0  # where the next words are looked for
        self.stop = len(text)

    def block(self, token: Token) -> None:
        if token.map:
            first, last = token.map
            self.at = max(self.at, self.lines[min(first, len(self.lines) - 1)])
            self.stop = self.lines[min(last, len(self.lines) - 1)]

    def find(self, words: str) -> list:
        """The positions of `words`: where they were written together, else each character found on its own
        (an escape, an entity), else added."""
        j = self.text.find(words, self.at, self.stop)
        if j >= 0:
            self.at = j + len(words)
            return list(range(j, self.at))
        out: list = []
        for c in words:
            j = self.text.find(c, self.at, self.stop)
            out.append(j if j >= 0 else None)
            self.at = j + 1 if j >= 0 else self.at
        return out


def _inline(token: Token, src: _Source) -> _Mapped:
    """The words of an inline token: text, code's text, image alt text; breaks as blanks; HTML left out."""
    text, pos = "", []
    for child in token.children or ():
        if child.type in ("text", "code_inline"):
            text, pos = text + child.content, pos + src.find(child.content)
        elif child.type == "image":
            alt = _inline(child, src) if child.children else (child.content, src.find(child.content))
            text, pos = text + alt[0], pos + alt[1]
        elif child.type in ("softbreak", "hardbreak"):
            text, pos = text + " ", pos + [None]
    return _strip((text, pos))


def _strip(mapped: _Mapped) -> _Mapped:
    text, pos = mapped
    begin = len(text) - len(text.lstrip())
    end = len(text.rstrip())
    return text[begin:end], pos[begin:end] if end > begin else []


def _ended(line: _Mapped) -> _Mapped:
    """`line` ending in punctuation: a sentence end added when it ends in a letter or digit."""
    text, pos = _strip(line)
    if not text or unicodedata.category(text[-1])[0] in "PS":
        return text, pos
    return text + ("。" if contains_chinese(text) else "."), pos + [None]


def _joined(sep: str, parts: list[_Mapped]) -> _Mapped:
    text, pos = "", []
    for k, (t, p) in enumerate(parts):
        if k:
            text, pos = text + sep, pos + [None] * len(sep)
        text, pos = text + t, pos + p
    return text, pos


def to_speech(text: str) -> str:
    """The words of a markdown text, block after block (see the module doc). Never raises for any text."""
    return to_speech_origin(text)[0]


def to_speech_origin(text: str) -> tuple[str, Origin]:
    """`to_speech(text)` and where each of its characters was written in `text` (`cosy.text.origin`)."""
    src = _Source(text)
    lines: list[_Mapped] = []
    row: list[_Mapped] | None = None  # the cells of the table row being read
    for token in _PARSER.parse(text):  # code blocks, HTML blocks and rules hold no inline token: left out
        if token.type == "tr_open":
            row = []
        elif token.type == "tr_close" and row is not None:
            cells = [c for c in row if c[0]]
            if cells:
                lines.append(_ended(_joined("，" if contains_chinese("".join(c[0] for c in cells)) else ", ",
                                            cells)))
            row = None
        elif token.type == "inline":
            src.block(token)
            words = _inline(token, src)
            if row is not None:
                row.append(words)
            elif words[0]:
                lines.append(_ended(words))
    speech, positions = _joined(" ", lines)
    return speech, Origin.of_positions(positions, len(text))


class MarkdownStream:
    """Markdown arriving in pieces, released as speech block by block (see the module doc)."""

    def __init__(self):
        self._held = ""
        self.origin = Origin()  # the speech released so far, from the pieces fed so far (`cosy.text.origin`)

    def feed(self, piece: str) -> str:
        """The speech of the blocks that `piece` completes ("" when none is complete yet)."""
        self._held += piece
        cut = _complete(self._held)
        if not cut:
            return ""
        done, self._held = self._held[:cut], self._held[cut:]
        return self._release(done, " ")

    def finish(self) -> str:
        """The speech of what is held (the text's end closes every block)."""
        done, self._held = self._held, ""
        return self._release(done, "")

    def _release(self, done: str, after: str) -> str:
        speech, origin = to_speech_origin(done)
        self.origin.extend(origin)
        if speech and after:
            self.origin.changed(0, len(after))
            return speech + after
        return speech


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
