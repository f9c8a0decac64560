"""SSML, the subset the managed CosyVoice service reads, parsed into what the pipeline knows: text to speak
(some of it with a reading mode or a pronunciation) and pauses of exact length.

    <speak rate="1.2" volume="80">请闭上眼睛<break time="500ms"/>好了。
      <sub alias="世界卫生组织">WHO</sub>的电话是<say-as interpret-as="telephone">12345</say-as>，
      <phoneme alphabet="py" ph="chong2 qing4">重庆</phoneme></speak>

    doc = parse(text)        # SsmlError (400) naming the line and column of the first problem
    doc.speed, doc.volume    # from <speak rate=... volume=...>: the request's speed and gain
    doc.items                # [Text | SayAs | Phoneme | Break, ...] in document order

A real XML parser (expat) reads the document; no DTD or entity declarations are accepted. Tags and
attributes (anything else is refused, so a typo never passes silently):
- `<speak>` (the root, once): `rate` 0.5-2.0 (speed), `volume` 0-100 (50 leaves the gain alone, 100 doubles
  it), `pitch` 1.0 only (the flow has no pitch control; any other value is refused, never ignored).
- `<break time="500ms"/>` or `"2s"`: silence, 1 ms to 10 s each, 60 s in all (MAX_BREAK_MS, MAX_SILENCE_MS).
- `<sub alias="...">text</sub>`: the alias is spoken instead of the text.
- `<say-as interpret-as="...">text</say-as>`: one of SAY_AS (the text normalizer reads it in that mode).
- `<phoneme alphabet="py|cmu" ph="...">text</phoneme>`: pinyin with tone numbers (`chong2 qing4`) or CMU
  phones (`HH AH0 L OW1`); what a model family does with them is the family's business.
The three inline tags hold text only. An error quotes at most 80 characters of what was sent
(`cosy.errors.echo`).

A text is taken for a document (`looks_like_ssml`) when, after blanks, it starts with `<speak`, an XML
declaration or a DOCTYPE: the last two are markup whatever follows, and the parser says what is wrong
with them (a DOCTYPE is never accepted). The check looks at the first few characters only.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from xml.parsers import expat

from cosy.errors import BadRequest, clip, echo

MAX_BREAK_MS = 10_000  # one <break>
MAX_SILENCE_MS = 60_000  # every <break> of a document together
RATE_RANGE = (0.5, 2.0)  # as the speed field (cosy.pipeline.request.SPEED_RANGE)
VOLUME_RANGE = (0, 100)  # 50: unchanged
SAY_AS = ("cardinal", "digits", "telephone", "characters", "date", "time", "currency")
ALPHABETS = ("py", "cmu")
# the root, an XML declaration or a DOCTYPE (refused by the parser, with its place) after blanks; possessive
# and without a scan to the head's end, so it is linear however many blanks follow (a pattern that looked
# past a DOCTYPE backtracked quadratically on blanks, in the frontend's event loop)
_SSML_START = re.compile(r"\s*+(?:<speak[\s/>]|<\?xml|<!DOCTYPE)")
_TIME = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s)\s*")
_ATTRIBUTES = {"speak": {"rate", "volume", "pitch", "version", "xmlns", "xml:lang"}, "break": {"time"},
               "sub": {"alias"}, "say-as": {"interpret-as", "format"}, "phoneme": {"alphabet", "ph"}}
_REQUIRED = {"break": ("time",), "sub": ("alias",), "say-as": ("interpret-as",), "phoneme": ("alphabet", "ph")}


class SsmlError(BadRequest):
    """SSML that cannot be spoken; the message names the line and column (1-based) of the problem."""

    def __init__(self, message: str, line: int, column: int):
        super().__init__(f"SSML line {line}, column {column}: {message}")
        self.line, self.column = line, column


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class Alias(Text):
    """A <sub>'s alias while the document is parsed (its reading is decided: pronunciation fixes leave it
    alone, `cosy.text.lexicon.fix_items`); a plain Text in the parsed document."""


@dataclass(frozen=True)
class SayAs:
    text: str
    interpret_as: str  # one of SAY_AS
    format: str | None = None  # say-as's format attribute (dates: ymd, dmy, ...), passed on


@dataclass(frozen=True)
class Phoneme:
    text: str  # what the document shows; the phones replace it
    alphabet: str  # "py" | "cmu"
    phones: tuple[str, ...]  # one syllable (py) or phone (cmu) each


@dataclass(frozen=True)
class Break:
    ms: int


Item = Text | SayAs | Phoneme | Break


@dataclass(frozen=True)
class Ssml:
    items: tuple[Item, ...]
    speed: float = 1.0
    volume: float = 1.0  # gain

    @property
    def text(self) -> str:
        """What is spoken, as plain text (aliases for sub, the shown text of say-as and phoneme): for limits."""
        return "".join(getattr(i, "text", "") for i in self.items)

    @property
    def silence_ms(self) -> int:
        return sum(i.ms for i in self.items if isinstance(i, Break))


def looks_like_ssml(text: str) -> bool:
    """Whether `text` is meant as a document: after blanks, <speak>, an XML declaration or a DOCTYPE."""
    return _SSML_START.match(text) is not None


def parse(doc: str, rewrite: Callable[[list[Item]], list[Item]] | None = None) -> Ssml:
    """The document's items, speed and gain; SsmlError at the first problem (nothing is partly accepted).
    `rewrite`: applied to the items before adjacent texts are joined (pronunciation fixes,
    `cosy.text.lexicon.fix_items`)."""
    return _Parser(doc, rewrite).run()


class _Parser:
    def __init__(self, doc: str, rewrite: Callable[[list[Item]], list[Item]] | None = None):
        self.doc, self.rewrite = doc, rewrite
        self.p = expat.ParserCreate(namespace_separator=None)
        self.p.StartElementHandler = self._start
        self.p.EndElementHandler = self._end
        self.p.CharacterDataHandler = self._chars
        self.p.StartDoctypeDeclHandler = lambda *_: self._fail("a DOCTYPE is not accepted")
        self.p.EntityDeclHandler = lambda *_: self._fail("entity declarations are not accepted")
        self.p.ProcessingInstructionHandler = lambda *_: self._fail("processing instructions are not accepted")
        self.items: list[Item] = []
        self.stack: list[tuple[str, dict]] = []
        self.inline: list[str] = []  # the text of the open sub / say-as / phoneme
        self.speed, self.volume = 1.0, 1.0

    def run(self) -> Ssml:
        if not looks_like_ssml(self.doc):
            raise SsmlError("the text is not SSML: it must be one <speak>...</speak> element", 1, 1)
        try:
            self.p.Parse(self.doc, True)
        except expat.ExpatError as e:
            raise SsmlError(f"malformed XML: {expat.ErrorString(e.code)}", e.lineno, e.offset + 1) from None
        silence = sum(i.ms for i in self.items if isinstance(i, Break))
        if silence > MAX_SILENCE_MS:
            raise SsmlError(f"the breaks add up to {silence} ms; at most {MAX_SILENCE_MS} ms in all", 1, 1)
        return Ssml(tuple(self._merged()), self.speed, self.volume)

    def _fail(self, message: str):
        raise SsmlError(message, self.p.CurrentLineNumber, self.p.CurrentColumnNumber + 1)

    def _start(self, tag: str, attrs: dict) -> None:
        if tag not in _ATTRIBUTES:
            self._fail(f"unknown tag <{clip(tag)}> (supported: {', '.join(f'<{t}>' for t in _ATTRIBUTES)})")
        parent = self.stack[-1][0] if self.stack else None
        if (tag == "speak") != (parent is None):
            self._fail("<speak> must be the root, once" if tag == "speak" else f"<{tag}> must be inside <speak>")
        if parent in ("sub", "say-as", "phoneme", "break"):
            self._fail(f"<{parent}> holds text only, not <{tag}>")
        unknown = sorted(set(attrs) - _ATTRIBUTES[tag])
        if unknown:
            self._fail(f"<{tag}> has no attribute {clip(', '.join(unknown))} (it takes "
                       f"{', '.join(sorted(_ATTRIBUTES[tag]))})")
        for name in _REQUIRED.get(tag, ()):
            if not attrs.get(name, "").strip():
                self._fail(f"<{tag}> needs a {name} attribute")
        getattr(self, "_open_" + tag.replace("-", "_"), lambda a: None)(attrs)
        self.stack.append((tag, attrs))
        self.inline = []

    def _open_speak(self, attrs: dict) -> None:
        if "rate" in attrs:
            self.speed = self._number(attrs["rate"], "rate", *RATE_RANGE)
        if "volume" in attrs:
            self.volume = self._number(attrs["volume"], "volume", *VOLUME_RANGE) / 50.0
        if "pitch" in attrs and self._number(attrs["pitch"], "pitch", 0.5, 2.0) != 1.0:
            self._fail("pitch is not supported: the voice keeps its own pitch (leave it out or use 1.0)")

    def _open_break(self, attrs: dict) -> None:
        m = _TIME.fullmatch(attrs["time"])
        if not m:
            self._fail(f"<break time={echo(attrs['time'])}>: use milliseconds or seconds, e.g. 500ms or 1.5s")
        ms = float(m[1]) * (1000 if m[2] == "s" else 1)
        if not 1 <= ms <= MAX_BREAK_MS or ms != int(ms):
            self._fail(f"<break time={echo(attrs['time'])}>: whole milliseconds from 1 to {MAX_BREAK_MS} (10s)")
        self.items.append(Break(int(ms)))

    def _open_say_as(self, attrs: dict) -> None:
        if attrs["interpret-as"] not in SAY_AS:
            self._fail(f"say-as interpret-as {echo(attrs['interpret-as'])} is not supported (use "
                       f"{', '.join(SAY_AS)})")

    def _open_phoneme(self, attrs: dict) -> None:
        if attrs["alphabet"] not in ALPHABETS:
            self._fail(f"phoneme alphabet {echo(attrs['alphabet'])} is not supported (use {' or '.join(ALPHABETS)})")
        bad = next((p for p in attrs["ph"].split() if not _PHONE[attrs["alphabet"]].fullmatch(p)), None)
        if bad is not None:
            what = "pinyin with a tone number 1-5, e.g. chong2" if attrs["alphabet"] == "py" else \
                "a CMU phone (vowels with or without a stress digit), e.g. HH AH0 L OW1"
            self._fail(f"phoneme ph {echo(bad)} is not {what}")

    def _number(self, value: str, name: str, low: float, high: float) -> float:
        try:
            x = float(value)
        except ValueError:
            x = float("nan")
        if not low <= x <= high:
            self._fail(f"<speak {name}={echo(value)}>: a number from {low:g} to {high:g}")
        return x

    def _end(self, tag: str) -> None:
        _, attrs = self.stack.pop()
        shown = "".join(self.inline)
        if tag == "sub":
            self.items.append(Alias(attrs["alias"]))
        elif tag == "say-as":
            if not shown.strip():
                self._fail("<say-as> is empty")
            self.items.append(SayAs(shown, attrs["interpret-as"], attrs.get("format")))
        elif tag == "phoneme":
            self.items.append(Phoneme(shown, attrs["alphabet"], tuple(attrs["ph"].split())))
        self.inline = []

    def _chars(self, data: str) -> None:
        tag = self.stack[-1][0] if self.stack else None
        if tag == "break" and data.strip():
            self._fail("<break> holds nothing")
        if tag in ("sub", "say-as", "phoneme"):
            self.inline.append(data)
        elif tag == "speak":
            self.items.append(Text(data))

    def _merged(self) -> list[Item]:
        """Adjacent Text items joined (expat hands text over in pieces)."""
        out: list[Item] = []
        for item in self.rewrite(self.items) if self.rewrite else self.items:
            if isinstance(item, Alias):
                item = Text(item.text)
            if isinstance(item, Text) and out and isinstance(out[-1], Text):
                out[-1] = Text(out[-1].text + item.text)
            else:
                out.append(item)
        return out


_PHONE = {
    "py": re.compile(r"[a-zü]+v?[1-5]"),  # pinyin syllable + tone (5: neutral); v stands for ü
    "cmu": re.compile(r"(?:AA|AE|AH|AO|AW|AY|EH|ER|EY|IH|IY|OW|OY|UH|UW)[012]?|"
                      r"B|CH|D|DH|F|G|HH|JH|K|L|M|N|NG|P|R|S|SH|T|TH|V|W|Y|Z|ZH"),
}
