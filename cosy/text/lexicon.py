"""Pronunciation fixes: a word or phrase read as pinyin / CMU phones (what SSML's <phoneme> does) or replaced
by another text (what <sub alias> does), applied to the caller's text before normalization.

    entries = parse_hot_fix({"pronunciation": [{"重庆": "chong2 qing4"}], "replace": [{"WHO": "世界卫生组织"}]})
    doc = plain_document("去重庆", entries)      # Ssml items: Text("去"), Phoneme("重庆", "py", ("chong2", "qing4"))

The same entries come from the shared lexicon (`cosy.deploy.lexicon`, kept by the operator) and from a
request's `hot_fix` (the managed service's shape); `ordered` puts them in the order they are matched.

Matching (one rule, `find`): the entries in order (a request's hot_fix first, then the lexicon; within each,
longest word first), each claiming every occurrence of its word that no earlier entry claimed. A word is
matched exactly (case included); one that starts (ends) with an ASCII letter or digit matches only where the
text has no ASCII letter or digit just before (after) it, so `cat` never matches inside `concatenate`.
Only the document's own text is matched: never a <sub> alias, a <say-as> or a <phoneme>, whose reading the
markup already decides.

A pronunciation is pinyin syllables with tone numbers 1-5 (lower case: `chong2 qing4`) or CMU phones
(upper case: `HH AH0 L OW1`), one alphabet per entry, checked as <phoneme>'s `ph` is (each one a phoneme
token of the CosyVoice3 tokenizer).
"""
from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from cosy.errors import BadRequest, echo
from cosy.text.origin import Origin
from cosy.text.ssml import _PHONE as PHONE_PATTERNS
from cosy.text.ssml import Item, Phoneme, Ssml, Text, parse
from cosy.text.ssml_text import phoneme_tag

log = logging.getLogger(__name__)

MAX_WORD_CHARS = 100
MAX_VALUE_CHARS = 500
MAX_HOT_FIX_ENTRIES = 200  # of one request, both lists together
KINDS = ("py", "cmu", "sub")  # pinyin, CMU phones, a replacement text


class LexiconError(BadRequest):
    """A malformed entry (400); the message names the entry and the problem."""


@dataclass(frozen=True)
class Entry:
    word: str  # what the caller writes
    kind: str  # one of KINDS
    value: str  # the pronunciation (phones separated by single spaces) or the replacement text

    @property
    def phones(self) -> tuple[str, ...]:
        return tuple(self.value.split())

    def to_dict(self) -> dict:
        return {"word": self.word, "kind": self.kind, "value": self.value}


def check_word(word: object, where: str) -> str:
    """A word or phrase to match: a non-blank string of at most MAX_WORD_CHARS, without tabs or line breaks."""
    if not isinstance(word, str):
        raise LexiconError(f"{where}: the word must be a string, got {type(word).__name__}")
    if not word.strip():
        raise LexiconError(f"{where}: the word is empty")
    if word != word.strip():
        raise LexiconError(f"{where}: the word {echo(word)} begins or ends with blanks: leave them out")
    if len(word) > MAX_WORD_CHARS:
        raise LexiconError(f"{where}: the word is {len(word)} characters; at most {MAX_WORD_CHARS}")
    if any(c in word for c in "\t\r\n"):
        raise LexiconError(f"{where}: the word {echo(word)} holds a tab or line break")
    return word


def pronunciation(value: object, where: str) -> tuple[str, str]:
    """(alphabet "py" | "cmu", the phones joined by single spaces), checked: LexiconError naming the first bad
    syllable or phone (a pinyin syllable without its tone, an unknown CMU phone, a mix of the two)."""
    if not isinstance(value, str) or not value.strip():
        raise LexiconError(f"{where}: the pronunciation is empty (pinyin with tones, e.g. 'chong2 qing4', or CMU "
                           "phones, e.g. 'HH AH0 L OW1')")
    phones = value.split()
    alphabet = "cmu" if phones[0][:1].isupper() else "py"
    for phone in phones:
        if PHONE_PATTERNS[alphabet].fullmatch(phone):
            continue
        if alphabet == "py" and PHONE_PATTERNS["py"].fullmatch(phone + "1"):
            raise LexiconError(f"{where}: pinyin syllable {echo(phone)} has no tone number: add 1-5 "
                               f"(5: neutral), e.g. {phone}1")
        if alphabet == "py" and PHONE_PATTERNS["cmu"].fullmatch(phone):
            raise LexiconError(f"{where}: {echo(value)} mixes pinyin and CMU phones: use one alphabet per entry")
        if alphabet == "cmu":
            raise LexiconError(f"{where}: unknown CMU phone {echo(phone)} (vowels with or without a stress digit "
                               "0-2, e.g. HH AH0 L OW1)")
        raise LexiconError(f"{where}: {echo(phone)} is not a pinyin syllable with a tone number 1-5 "
                           "(e.g. chong2)")
    try:
        for phone in phones:
            phoneme_tag(phone, alphabet)
    except BadRequest as e:
        raise LexiconError(f"{where}: {e}") from None
    return alphabet, " ".join(phones)


def make_entry(word: object, kind: object, value: object, where: str) -> Entry:
    """One checked entry; `kind` "sub" for a replacement, "py"/"cmu" (or "phoneme": either, told apart by
    case) for a pronunciation. LexiconError naming `where` and the problem."""
    word = check_word(word, where)
    if kind == "sub":
        if not isinstance(value, str) or not value.strip():
            raise LexiconError(f"{where}: the replacement of {echo(word)} is empty")
        if len(value) > MAX_VALUE_CHARS or any(c in value for c in "\t\r\n"):
            raise LexiconError(f"{where}: the replacement of {echo(word)} must be one line of at most "
                               f"{MAX_VALUE_CHARS} characters, without tabs")
        return Entry(word, "sub", value)
    if kind not in ("py", "cmu", "phoneme"):
        raise LexiconError(f"{where}: kind {echo(kind)} is not one of py (pinyin), cmu (CMU phones) or sub "
                           "(a replacement text)")
    alphabet, phones = pronunciation(value, where)
    if kind != "phoneme" and alphabet != kind:
        raise LexiconError(f"{where}: kind {kind} but {echo(value)} is written in "
                           f"{'CMU phones' if alphabet == 'cmu' else 'pinyin'}")
    return Entry(word, alphabet, phones)


def parse_hot_fix(value: object, where: str = "hot_fix") -> tuple[Entry, ...]:
    """A request's hot_fix, the managed service's shape: {"pronunciation": [{"草地": "cao3 di4"}, ...],
    "replace": [{"草地": "草弟"}, ...]} (a JSON string of it too; None or {}: none). A word appears once.
    LexiconError naming the entry (e.g. hot_fix.pronunciation[1]) and the problem."""
    if value is None or value == "" or value == {}:
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise LexiconError(f"{where} is not valid JSON: send an object with 'pronunciation' and 'replace' "
                               "lists") from None
    if not isinstance(value, dict):
        raise LexiconError(f"{where} must be an object with 'pronunciation' and/or 'replace' lists, got "
                           f"{type(value).__name__}")
    unknown = sorted(set(value) - {"pronunciation", "replace"})
    if unknown:
        raise LexiconError(f"{where} has no field {echo(', '.join(map(str, unknown)))} (it takes pronunciation "
                           "and replace)")
    out: list[Entry] = []
    seen: set[str] = set()
    for name, kind in (("pronunciation", "phoneme"), ("replace", "sub")):
        items = value.get(name) or []
        if not isinstance(items, list):
            raise LexiconError(f"{where}.{name} must be a list of {{word: "
                               f"{'pronunciation' if kind != 'sub' else 'replacement'}}} objects")
        for i, item in enumerate(items):
            at = f"{where}.{name}[{i}]"
            if not isinstance(item, dict) or not item:
                raise LexiconError(f"{at} must be an object {{word: "
                                   f"{'pronunciation' if kind != 'sub' else 'replacement'}}}")
            for word, fix in item.items():
                entry = make_entry(word, kind, fix, at)
                if entry.word in seen:
                    raise LexiconError(f"{at}: {echo(entry.word)} appears twice in {where}: give each word once")
                seen.add(entry.word)
                out.append(entry)
                if len(out) > MAX_HOT_FIX_ENTRIES:
                    raise LexiconError(f"{where} has more than {MAX_HOT_FIX_ENTRIES} entries: put lasting fixes "
                                       "in the lexicon")
    return tuple(out)


def ordered(first: Iterable[Entry], then: Iterable[Entry] = ()) -> tuple[Entry, ...]:
    """The order entries are matched in: `first` (a request's hot_fix) before `then` (the lexicon), each longest
    word first; an entry of `then` whose word `first` has is left out."""
    first = sorted(first, key=lambda e: -len(e.word))
    words = {e.word for e in first}
    return tuple(first) + tuple(sorted((e for e in then if e.word not in words), key=lambda e: -len(e.word)))


def request_fixes(hot_fix: Sequence[Entry], lexicon: Sequence[Entry], phoneme_tags: bool,
                  text: str | None = None, ssml: bool = False) -> tuple[Entry, ...]:
    """What one request applies (`ordered`: its hot_fix, then the lexicon). A family without phoneme tokens
    (CosyVoice2, `phoneme_tags` False) refuses a hot_fix pronunciation (400, as it refuses <phoneme>) and
    leaves the lexicon's pronunciations out (logged once per word: the operator's lexicon serves every family,
    and a request is not refused for an entry it did not ask for). With `text` (a whole text, not a duplex
    stream): only the entries that match it (SSML: that occur in it), none when nothing does."""
    if not phoneme_tags:
        spoken = next((e for e in hot_fix if e.kind != "sub"), None)
        if spoken is not None:
            raise LexiconError(f"hot_fix.pronunciation ({echo(spoken.word)}) needs a model whose tokenizer has "
                               "phoneme tokens (CosyVoice3); this model reads text only: use hot_fix.replace "
                               "with the word written as it sounds")
        skipped = [e.word for e in lexicon if e.kind != "sub" and e.word not in _SKIPPED]
        if skipped:
            _SKIPPED.update(skipped)
            log.info("lexicon: this model has no phoneme tokens (CosyVoice2): the pronunciations of %s are not "
                     "applied (replacements are)", ", ".join(map(repr, skipped[:20])) + (" ..." * bool(skipped[20:])))
        lexicon = [e for e in lexicon if e.kind == "sub"]
    entries = ordered(hot_fix, lexicon)
    if text is None or not entries:
        return entries
    if ssml:
        return occurring(text, entries)
    used = {id(entry) for _, _, entry in find(text, entries)}
    return tuple(e for e in entries if id(e) in used)


_SKIPPED: set[str] = set()  # lexicon pronunciations this process has logged as left out


def _latin(c: str) -> bool:
    return c.isascii() and c.isalnum()


def find(text: str, entries: Sequence[Entry], before: str = "") -> list[tuple[int, int, Entry]]:
    """The (start, end, entry) spans the entries (in `ordered` order) claim in `text`, by start; `before`: the
    character before `text` (a stream's), for the word boundary at its start."""
    claimed = bytearray(len(text))
    spans = []
    for entry in entries:
        word, n = entry.word, len(entry.word)
        start = text.find(word)
        while start >= 0:
            end = start + n
            prior = text[start - 1] if start else before
            if not any(claimed[start:end]) and not (_latin(word[0]) and prior and _latin(prior)) \
                    and not (_latin(word[-1]) and end < len(text) and _latin(text[end])):
                claimed[start:end] = b"\1" * n
                spans.append((start, end, entry))
                start = text.find(word, end)
            else:
                start = text.find(word, start + 1)
    return sorted(spans, key=lambda s: s[0])


def occurring(text: str, entries: Iterable[Entry]) -> tuple[Entry, ...]:
    """The entries whose word occurs in `text` (what a request needs of a large lexicon), order kept."""
    return tuple(e for e in entries if e.word in text)


def fix_text(text: str, entries: Sequence[Entry]) -> list[Item]:
    """`text` as items: a matched pronunciation a Phoneme of the word, a matched replacement its text."""
    return items_of(text, find(text, entries))


def items_of(text: str, spans: Sequence[tuple[int, int, Entry]]) -> list[Item]:
    """`text` as items, with `find`'s spans of it (or the first of them) applied."""
    out: list[Item] = []
    at = 0
    for start, end, entry in spans:
        if start > at:
            out.append(Text(text[at:start]))
        out.append(Text(entry.value) if entry.kind == "sub" else Phoneme(text[start:end], entry.kind, entry.phones))
        at = end
    if at < len(text):
        out.append(Text(text[at:]))
    return out


def fix_items(items: Sequence[Item], entries: Sequence[Entry]) -> list[Item]:
    """A document's items (as the SSML parser collects them, before merging) with the entries applied to its
    own text (`Text`, adjacent pieces joined first); <sub> aliases (`cosy.text.ssml.Alias`), <say-as> and
    <phoneme> as they are."""
    out: list[Item] = []
    for item in _joined(items):
        out += fix_text(item.text, entries) if type(item) is Text else [item]
    return out


def _joined(items: Sequence[Item]) -> list[Item]:
    """Adjacent pieces of the document's own text (`Text`, not an alias) as one: what the entries are matched in."""
    joined: list[Item] = []
    for item in items:
        if type(item) is Text and joined and type(joined[-1]) is Text:
            joined[-1] = Text(joined[-1].text + item.text)
        else:
            joined.append(item)
    return joined


def items_origin(items: Sequence[Item], entries: Sequence[Entry]) -> tuple[str, Origin]:
    """The text of a document's items before `fix_items` (what the caller wrote) and where the fixed
    document's text came from in it (`cosy.text.origin`: each replacement a region; a pronunciation keeps
    its word)."""
    texts, replaced, at = [], [], 0
    for item in _joined(items):
        text = getattr(item, "text", "")
        if type(item) is Text:
            replaced += [(at + s, at + e, len(x.value)) for s, e, x in find(text, entries) if x.kind == "sub"]
        texts.append(text)
        at += len(text)
    return "".join(texts), Origin.replaced(at, replaced)


def document_origin(text: str, ssml: bool, entries: Sequence[Entry]) -> tuple[str, Origin]:
    """The caller's text of a request with fixes (a plain text, or an SSML document's text content without
    them) and where the fixed document's text (`Ssml.text`) came from in it."""
    if not ssml:
        return items_origin([Text(text)], entries)
    seen: list[Item] = []

    def rewrite(items: list[Item]) -> list[Item]:
        seen.extend(items)
        return fix_items(items, entries)

    parse(text, rewrite)
    return items_origin(seen, entries)


def plain_document(text: str, entries: Sequence[Entry]) -> Ssml:
    """A plain text with the entries applied, as the document the engine speaks (no breaks, rate 1, gain 1):
    the items of the hand-written SSML that marks the same words up."""
    out: list[Item] = []
    for item in fix_text(text, entries):
        if isinstance(item, Text) and out and isinstance(out[-1], Text):
            out[-1] = Text(out[-1].text + item.text)
        else:
            out.append(item)
    return Ssml(tuple(out))


__all__ = ["Entry", "KINDS", "LexiconError", "check_word", "document_origin", "find", "fix_items", "fix_text",
           "items_of", "items_origin", "make_entry", "occurring", "ordered", "parse_hot_fix", "plain_document",
           "pronunciation", "request_fixes"]
