"""An SSML document (`cosy.text.ssml`) as what the text frontend reads: runs of text between the pauses, each a
list of pieces to normalize (text, sub aliases, say-as readings) and pieces taken as they are (phoneme tags).

    runs = spoken_runs(parse(doc), phoneme_tags=True)
    # [Run([("text", "请说"), ("tags", "[ch][óng][q][ìng]")]), Break(500), Run([("text", "好的")])]

A run of plain text that is only punctuation or symbols (`cosy.text.split.is_only_punctuation`, the rule by
which the normalizer drops such segments of plain text) has nothing to speak and is left out (the full stop
after a break); a document left with no run to speak, breaks or not, is refused as plain text with nothing
to speak is (a 400, before any audio).

say-as readings (our rules; the language is the document's: Chinese if it holds any Chinese character):
digits and telephone read digit by digit (Chinese 一二三, a telephone's 1 as 幺; English one two three),
characters one by one; cardinal, date, time and currency are left to the normalizer, which reads numbers as
cardinals and knows the common date, time and currency forms (wetext or ttsfrd).

Phoneme tags are the CosyVoice3 tokenizer's own phoneme tokens (`cosy.text.specials.PHONEMES`): a pinyin
syllable is its initial and its tonal final (`chong2` -> `[ch][óng]`, the form the official frontend keeps
through Chinese normalization, `报道[j][ǐ]予好评`), a CMU phone itself (`AH0` -> `[AH0]`). A family without those
tokens (CosyVoice2) refuses <phoneme>.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from cosy.errors import BadRequest
from cosy.text.normalize import contains_chinese
from cosy.text.specials import PHONEMES
from cosy.text.split import is_only_punctuation
from cosy.text.ssml import Break, Phoneme, SayAs, Ssml, Text

_ZH_DIGITS = "零一二三四五六七八九"
_EN_DIGITS = "zero one two three four five six seven eight nine".split()
_INITIALS = ("zh", "ch", "sh", "b", "p", "m", "f", "d", "t", "n", "l", "g", "k", "h", "j", "q", "x", "r", "z",
             "c", "s", "y", "w")
_MARKS = {"a": "āáǎà", "e": "ēéěè", "i": "īíǐì", "o": "ōóǒò", "u": "ūúǔù", "ü": "ǖǘǚǜ"}
_TAGS = frozenset(PHONEMES)


@dataclass
class Run:
    """Text between two pauses: ("text", s) pieces are normalized, ("tags", s) pieces are kept as they are."""

    pieces: list[tuple[str, str]] = field(default_factory=list)

    @property
    def plain(self) -> bool:
        return all(kind == "text" for kind, _ in self.pieces)

    @property
    def text(self) -> str:
        return "".join(s for _, s in self.pieces)

    @property
    def silent(self) -> bool:
        """Nothing to speak: plain text of blanks, punctuation and symbols only."""
        return self.plain and is_only_punctuation(self.text.strip())


def spoken_runs(doc: Ssml, phoneme_tags: bool) -> list[Run | Break]:
    """The document as runs and pauses, in order (runs with nothing to speak dropped); BadRequest when no run
    is left to speak, or a <phoneme> cannot be read by this family (`phoneme_tags`: its tokenizer has the
    phoneme tokens) or names no such token."""
    zh = contains_chinese(doc.text)
    out: list[Run | Break] = []
    run = Run()
    for item in doc.items:
        if isinstance(item, Break):
            out += [run, item] if run.pieces and not run.silent else [item]
            run = Run()
        elif isinstance(item, Text):
            run.pieces.append(("text", item.text))
        elif isinstance(item, SayAs):
            run.pieces.append(("text", say_as(item, zh)))
        elif isinstance(item, Phoneme):
            if not phoneme_tags:
                raise BadRequest("<phoneme> needs a model whose tokenizer has phoneme tokens (CosyVoice3); this "
                                 "model reads text only: write the word as it sounds, or use <sub alias>")
            run.pieces.append(("tags", "".join(phoneme_tag(p, item.alphabet) for p in item.phones)))
    if run.pieces and not run.silent:
        out.append(run)
    if not any(isinstance(part, Run) for part in out):
        raise BadRequest("the SSML document has nothing to speak: its text is only punctuation or symbols"
                         + (" beside its breaks" if out else "") + " (as plain text, it would be refused the same)")
    return out


def say_as(item: SayAs, zh: bool) -> str:
    """The text to normalize for one <say-as> (`zh`: the document is Chinese)."""
    text = item.text.strip()
    if item.interpret_as in ("digits", "telephone"):
        words = []
        for c in text:
            if c.isdigit() and c.isascii():
                words.append(("幺" if c == "1" and item.interpret_as == "telephone" else _ZH_DIGITS[int(c)]) if zh
                             else _EN_DIGITS[int(c)])
            elif c in "-– ()" and item.interpret_as == "telephone":
                if words and words[-1] not in "，,":
                    words.append("，" if zh else ",")  # a group's pause
            elif not c.isspace():
                words.append(c)
        return ("".join(words) if zh else " ".join(words).replace(" ,", ",")).strip("，, ")
    if item.interpret_as == "characters":
        return ("" if zh else " ").join(c for c in text if not c.isspace())
    return text  # cardinal, date, time, currency: the normalizer's own reading


def phoneme_tag(phone: str, alphabet: str) -> str:
    """One pinyin syllable (tone 1-5) or CMU phone as the CosyVoice3 phoneme tokens' text; BadRequest when
    the tokenizer has no such token."""
    if alphabet == "cmu":
        tags = f"[{phone}]"
    else:
        syllable, tone = phone[:-1], int(phone[-1])
        initial = next((i for i in _INITIALS if syllable.startswith(i) and len(syllable) > len(i)), "")
        # the tokens spell ü alone as ü (ǚ) and üe as ve (vè), as typed pinyin does
        final = syllable[len(initial):].replace("üe", "ve")
        if not any(c in final for c in "aeiouüv"):
            raise BadRequest(f"phoneme {phone!r} is not a pinyin syllable: its final has no vowel")
        final = _tone_marked("ü" if final == "v" else final, tone)
        tags = (f"[{initial}]" if initial else "") + f"[{final}]"
    missing = [t for t in tags.replace("][", "]\0[").split("\0") if t not in _TAGS]
    if missing:
        raise BadRequest(f"phoneme {phone!r} has no phoneme token {', '.join(missing)} in the CosyVoice3 tokenizer")
    return tags


def _tone_marked(final: str, tone: int) -> str:
    """The final with its tone mark (tone 5, neutral: none), on a or e, else o of ou, else the last vowel."""
    if tone == 5:
        return final
    if "a" in final or "e" in final:
        at = final.index("a" if "a" in final else "e")
    elif "ou" in final:
        at = final.index("o")
    else:
        at = max((k for k, c in enumerate(final) if c in _MARKS), default=-1)
        if at < 0:
            return final
    return final[:at] + _MARKS[final[at]][tone - 1] + final[at + 1:]
