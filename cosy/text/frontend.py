"""The text frontend: normalize, split into sentences, tokenize (official `text_normalize`, text_frontend=True).

    frontend = TextFrontend(TextTokenizer.from_dir(model_dir / "CosyVoice-BlankEN"))
    for segment, ids in frontend.segments("今天是2024年5月20日。"):
        ...

One instance serves concurrent requests: the tokenizer is read-only and each normalizer serializes its
own calls. Construct it once; loading the wetext FSTs takes a fraction of a second.
"""
from __future__ import annotations

import logging
from pathlib import Path

from cosy.text.normalize import NumberSpeller, TtsfrdNormalizer, WetextNormalizer, contains_chinese, zh_rules
from cosy.text.specials import COSYVOICE2
from cosy.text.split import is_only_punctuation, split_paragraph, split_to_fit
from cosy.text.tokenizer import TextTokenizer

__all__ = ["TextFrontend"]

log = logging.getLogger(__name__)

END_OF_PROMPT = COSYVOICE2[0]  # "<|endofprompt|>": what precedes it in a text is a prompt (CosyVoice3's system prompt)


def _ttsfrd_or_none(ttsfrd_dir: str | Path | None) -> TtsfrdNormalizer | None:
    """ttsfrd when a resource dir is given and the module imports; None (use wetext) otherwise."""
    if ttsfrd_dir is None:
        return None
    try:
        import ttsfrd  # noqa: F401  (not on PyPI; present only where installed by hand)
    except ImportError:
        log.info("ttsfrd is not installed; using wetext")
        return None
    return TtsfrdNormalizer(ttsfrd_dir)


class TextFrontend:
    """Text -> normalized segments -> token ids, as the official CosyVoice2 frontend does it."""

    def __init__(self, tokenizer: TextTokenizer, ttsfrd_dir: str | Path | None = None):
        self.tokenizer = tokenizer
        self._ttsfrd = _ttsfrd_or_none(ttsfrd_dir)
        self._wetext = None if self._ttsfrd else WetextNormalizer()
        self._spell_numbers = None if self._ttsfrd else NumberSpeller()
        self.backend: str = "ttsfrd" if self._ttsfrd else "wetext"

    def _length(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def _normalize_split(self, text: str) -> tuple[str, list[str]]:
        """(whole normalized text, its segments) for a stripped, non-empty text."""
        if self._ttsfrd is not None:
            segments = self._ttsfrd(text)
            return "".join(segments), segments
        if contains_chinese(text):
            text = zh_rules(self._wetext(text, "zh"))
            return text, split_paragraph(text, "zh")
        text = self._spell_numbers(self._wetext(text, "en"))
        return text, split_paragraph(text, "en", self._length)

    def normalize(self, text: str, split: bool = True) -> list[str]:
        """Normalized segments of `text` (split=True) or [the whole normalized text] (split=False).

        Text with `<|`...`|>` (e.g. `<|endofprompt|>`) is returned as it is. '' gives [''] as officially;
        whitespace only gives [] (the official code crashes). Segments made only of punctuation or
        symbols (emoji included) are dropped.
        """
        if text == "" or ("<|" in text and "|>" in text):
            return [text]
        whole, segments = self._normalize_split(text.strip()) if text.strip() else ("", [])
        if not split:
            return [whole]
        return [s for s in segments if not is_only_punctuation(s)]

    def encode(self, text: str) -> list[int]:
        """Token ids of already normalized text (no normalization here)."""
        return self.tokenizer.encode(text)

    def tagged_segments(self, pieces: list[tuple[str, str]]) -> list[tuple[str, list[int]]]:
        """Segments and ids of a text whose ("text", s) pieces are normalized one by one and whose ("tags", s)
        pieces (phoneme tokens, which normalization would break) are kept as they are, then split into
        sentences as a whole (SSML's <phoneme>, `cosy.text.ssml_text`)."""
        joined = "".join(self.normalize(s, split=False)[0] if kind == "text" and s.strip() else s
                         for kind, s in pieces).strip()
        if not joined:
            return []
        zh = contains_chinese(joined)
        parts = split_paragraph(joined, "zh" if zh else "en", None if zh else self._length)
        return [(p, self.encode(p)) for p in parts if not is_only_punctuation(p)]

    def fit(self, segment: str, limit: int) -> list[str]:
        """`segment` (normalized) cut into pieces of at most `limit` token ids, at the next-best boundaries
        (`cosy.text.split.split_to_fit`); a prompt that ends in <|endofprompt|> at its start (CosyVoice3's
        system prompt) begins every piece. NoSplit when a piece that cannot be cut does not fit."""
        cut = segment.rfind(END_OF_PROMPT)
        prompt = segment[:cut + len(END_OF_PROMPT)] if cut >= 0 else ""
        room = limit - (self._length(prompt) if prompt else 0)
        return [prompt + piece for piece in split_to_fit(segment[len(prompt):], self._length, room)]

    def segments(self, text: str) -> list[tuple[str, list[int]]]:
        """normalize(text) and the token ids of each segment."""
        return [(s, self.encode(s)) for s in self.normalize(text, split=True)]
