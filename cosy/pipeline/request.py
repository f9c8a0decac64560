"""One synthesis request, the same typed value from every surface (WebUI, gradio_client, HTTP, CLI) to the
worker process that runs it, and the rules it must satisfy (one definition each).

    req = SynthesisRequest(mode="zero_shot", text="你好", prompt_text="...", prompt_wav="me.wav", seed=0)
    req.check()                                         # SynthesisError (400) naming the field
    wire = req.to_wire()                                # plain values + numpy arrays: crosses a Pipe
    same = SynthesisRequest.from_wire(wire)             # in the worker

A saved voice is named by `voice_id`; the frontend service resolves it into `voice` (its stored
features) before the request leaves the process, so workers never read the data dir.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import unicodedata
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from cosy.errors import BadRequest, clip, echo
from cosy.prompt.encoder import PromptFeatures
from cosy.text.language import check_language
from cosy.text.lexicon import Entry, fix_items, plain_document
from cosy.text.ssml import Ssml, parse

# zero_shot: 3 s clone (prompt audio + its transcript); cross_lingual: prompt audio only; instruct: prompt
# audio + an instruction; voice: a saved voice; vc: voice conversion (no LM), CLI only.
MODES = ("zero_shot", "cross_lingual", "instruct", "voice", "vc")
SERVED_MODES = MODES[:4]  # what the frontends offer
SPEED_RANGE = (0.5, 2.0)  # the flow's mel-length scaling; beyond it speech breaks down
SEED_RANGE = (0, 2**31 - 1)  # what the LM backends accept as a per-request seed
MAX_TEXT_CHARS = 20000
# a prompt's transcript (at most 30 s of speech) and an instruction are short; the LM budget below also applies
MAX_PROMPT_TEXT_CHARS = 1000
MAX_INSTRUCT_CHARS = 1000
# the options of the HTTP APIs (one definition each; the surfaces import these)
SAMPLE_RATE_RANGE = (8000, 48000)  # output sample rate (Hz)
PCM_RATE_RANGE = (8000, 192000)  # the rate of a raw .pcm upload (Hz)
VOLUME_RANGE = (0.0, 10.0)  # output gain
LIMIT_RANGE = (1, 1000)  # list sizes
# What the LM must hold for one sentence (see `check_lm_budget`): characters count as tokens (close for
# Chinese, an over-estimate for Latin text), and the LM may produce up to 20 speech tokens per text token.
LM_FIXED_TOKENS = 2  # sos + task id
LM_SENTENCE_TOKENS = 20  # the shortest sentence the budget keeps room for (and its speech)
LM_SPEECH_PER_TEXT_TOKEN = 20
# a duplex text is decoded in LM segments of at most this many text ids (a sentence, or a cut of a longer one,
# `Engine.synthesize_duplex`): the context holds one segment, however long the streamed text grows
LM_DUPLEX_SEGMENT_TOKENS = 40
EMBEDDED_LM_MAX_LEN = 8192  # the embedded LM's documented limit (the backend's is its --max_model_len)
# Priority classes, most urgent first: a request's class orders the frontend's worker queue (then arrival, with
# aging), its worker's flow/HiFT work and, as vLLM's `priority` (lower first), the LM backend's queue
PRIORITIES = ("interactive", "default", "bulk")
# the surfaces whose requests are bulk unless they say otherwise (`default_priority`)
BULK_SURFACES = frozenset({"batch"})
PRIORITY_AGING = 10.0  # seconds a waiting request (or work item) takes to move up one class (`aged_rank`)
# characters that carry nothing to speak: controls (NUL ...), format (zero-width U+200B-U+200D, U+FEFF,
# bidi marks ...), separators and the unassigned / private / surrogate ranges
_SILENT_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp"})


class SynthesisError(BadRequest):
    """A request that cannot be synthesized; the message says what to change."""


@dataclass
class SynthesisRequest:
    """What to say, in which voice, how. `prompt_wav`/`source_wav`: a path (or, in-process only, file bytes
    or (array, rate)); `voice`: stored prompt features, which replace `prompt_wav` in every mode."""

    mode: str
    text: str = ""
    prompt_text: str = ""
    prompt_wav: Any = None
    instruct_text: str = ""
    voice_id: str | None = None
    voice: PromptFeatures | None = None
    source_wav: Any = None  # mode 'vc': the speech to convert
    stream: bool = False
    speed: float = 1.0
    seed: int | None = None
    greedy: bool = False  # argmax decoding instead of RAS (comparisons between LM engines)
    duplex: bool = False  # the text arrives in pieces while audio streams out (`Engine.synthesize_duplex`)
    ssml: bool = False  # `text` is an SSML document (`cosy.text.ssml`): breaks, sub, say-as, phoneme, rate, volume
    priority: str | None = None  # one of PRIORITIES; None: the surface's default (`default_priority`)
    word_timestamps: bool = False  # each sentence's words timed by the frontend's aligner (`--aligner`, cosy.align)
    # pronunciation fixes (`cosy.text.lexicon`): the caller's hot_fix, and what the engine applies (the hot_fix
    # and the shared lexicon's entries, `cosy.text.lexicon.ordered`; the frontend resolves it, `resolve_fixes`)
    hot_fix: tuple[Entry, ...] = ()
    fixes: tuple[Entry, ...] = ()
    # language_hints' first entry (`cosy.text.language`): the language numbers, dates, times and money are read
    # in; None, zh, en: the official path
    language: str | None = None
    markdown: bool = False  # enable_markdown_filter: the text is markdown, spoken as a listener should hear it

    def check(self) -> "SynthesisRequest":
        """Raise SynthesisError naming the first field that breaks a rule; returns self."""
        if self.mode not in MODES:
            raise SynthesisError(f"unknown mode {_shown(self.mode)} (choose from {', '.join(MODES)})")
        for name, limit in (("text", MAX_TEXT_CHARS), ("prompt_text", MAX_PROMPT_TEXT_CHARS),
                            ("instruct_text", MAX_INSTRUCT_CHARS)):
            if getattr(self, name) is None:
                setattr(self, name, "")
            check_text(getattr(self, name), name, limit, required=False)
        check_speed(self.speed)
        check_seed(self.seed)
        check_priority(self.priority)
        self.language = check_language(self.language)
        if self.markdown and self.ssml:
            raise SynthesisError("enable_markdown_filter applies to plain text; an SSML document (enable_ssml) "
                                 "says what to speak itself: turn one of them off")
        if self.mode == "vc" and self.duplex:
            raise SynthesisError("mode 'vc' has no text to stream")
        if self.mode != "vc" and not self.duplex:  # duplex: the pieces are checked as they arrive
            check_text(self.text, "text", MAX_TEXT_CHARS)
        if self.ssml:
            self.ssml_document()
        return self

    def ssml_document(self) -> Ssml:
        """The parsed SSML text (`cosy.text.ssml.Ssml`; a plain text with `fixes`: the document that marks
        them up, `cosy.text.lexicon.plain_document`), `fixes` applied, checked: something to speak, a mode
        with text, the document's rate times `speed` within SPEED_RANGE. SynthesisError (or SsmlError, with
        the position)."""
        if self.mode == "vc" or self.duplex:
            raise SynthesisError("SSML needs the whole text in one piece" if self.duplex
                                 else "mode 'vc' has no text to mark up with SSML")
        doc = (parse(self.text, functools.partial(fix_items, entries=self.fixes) if self.fixes else None)
               if self.ssml else plain_document(self.text, self.fixes))
        check_text(doc.text, "the SSML document's text", MAX_TEXT_CHARS)
        low, high = SPEED_RANGE
        if not low <= self.speed * doc.speed <= high:
            raise SynthesisError(f"speed {self.speed:g} times the SSML rate {doc.speed:g} is out of range "
                                 f"({low} to {high})")
        return doc

    def to_wire(self) -> dict:
        """Plain values and numpy arrays (picklable, no torch tensors); `prompt_wav` must be a path."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for name in ("prompt_wav", "source_wav"):
            if out[name] is not None:
                out[name] = str(out[name])
        out["voice"] = self.voice.to_arrays() if self.voice is not None else None
        return out

    @classmethod
    def from_wire(cls, wire: dict) -> "SynthesisRequest":
        voice = wire.get("voice")
        return cls(**{**wire, "voice": PromptFeatures.from_arrays(voice) if voice is not None else None})


def _shown(value: object) -> str:
    """A client's value in an error message: a number as written, anything else quoted (`cosy.errors.echo`);
    at most ECHO_CHARS characters of either."""
    return clip(repr(value)) if isinstance(value, (int, float)) else echo(value)


def as_number(value: object, name: str, kind: type = float) -> float | int | None:
    """A number from a loosely typed surface (gradio sends floats for ints, raw API calls anything):
    None stays None; whole floats become ints for `kind=int`; anything else is a SynthesisError naming `name`."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise SynthesisError(f"{name} must be a number, got {_shown(value)}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise SynthesisError(f"{name} must be a number, got {_shown(value)}")
    try:
        if kind is int:
            if float(value) != int(value):
                raise SynthesisError(f"{name} must be a whole number, got {_shown(value)}")
            return int(value)
        return float(value)
    except OverflowError:  # infinite, or a whole number beyond any float (JSON allows both)
        raise SynthesisError(f"{name} is out of range") from None


def check_speed(speed: object) -> float:
    low, high = SPEED_RANGE
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not low <= speed <= high:
        raise SynthesisError(f"speed {_shown(speed)} is out of range ({low} to {high})")
    return float(speed)


def check_seed(seed: object) -> int | None:
    if seed is None:
        return None
    low, high = SEED_RANGE
    if isinstance(seed, bool) or not isinstance(seed, int) or not low <= seed <= high:
        raise SynthesisError(f"seed {_shown(seed)} is out of range ({low} to {high})")
    return seed


def check_priority(priority: object, name: str = "priority") -> str | None:
    """None (the surface's default) or one of PRIORITIES; SynthesisError naming `name` and the choices."""
    if priority is None or isinstance(priority, str) and priority in PRIORITIES:
        return priority
    raise SynthesisError(f"{name} must be one of {', '.join(PRIORITIES)} (most urgent first), got {echo(priority)}")


def default_priority(surface: str, stream: bool) -> str:
    """The class of a request that names none: batch synthesis bulk, streams (the WebSocket sessions always
    stream) interactive, the rest (whole files) default."""
    if surface in BULK_SURFACES:
        return "bulk"
    return "interactive" if stream else "default"


def priority_rank(priority: str | None) -> int:
    """0 for the most urgent class (PRIORITIES' order); None counts as "default"."""
    return PRIORITIES.index(priority or "default")


def aged_rank(rank: int, waited: float, aging: float = PRIORITY_AGING) -> int:
    """The class a request (or its work) competes in after waiting `waited` s: one up every `aging` s, so that
    work of a less urgent class is never starved (`--priority_aging`)."""
    return max(0, rank - int(waited // aging))


def speakable(text: str) -> str:
    """`text` without what carries nothing to speak (controls, zero-width and format characters, spaces)."""
    return "".join(c for c in text if unicodedata.category(c) not in _SILENT_CATEGORIES)


def check_text(value: object, name: str, limit: int, required: bool = True) -> str:
    """A string of at most `limit` characters; `required`: with something to speak. SynthesisError naming `name`."""
    if not isinstance(value, str):
        raise SynthesisError(f"{name} must be a string, got {type(value).__name__}")
    if len(value) > limit:
        raise SynthesisError(f"{name} is {len(value)} characters; the limit is {limit}")
    if required and not speakable(value):
        raise SynthesisError(f"{name} is empty: nothing to speak" + (
            " (it holds only control, zero-width or space characters)" if value else ""))
    return value


def check_range(value: object, name: str, low: float, high: float, kind: type = float) -> float | int:
    """A number (see `as_number`) within [low, high]; SynthesisError naming `name` and the range."""
    number = as_number(value, name, kind)
    if number is None:
        raise SynthesisError(f"{name} is required ({low:g} to {high:g})")
    if not math.isfinite(number) or not low <= number <= high:
        raise SynthesisError(f"{name} {_shown(value)} is out of range ({low:g} to {high:g})")
    return number


def clean_filename(name: object, default: str = "upload") -> str:
    """An uploaded file's name as we store and show it: its last path component, without control, format
    or other invisible characters (a NUL byte, bidi overrides), at most 255 characters."""
    base = PurePosixPath(str(name or "").replace("\\", "/")).name
    base = "".join(c for c in base if unicodedata.category(c) not in _SILENT_CATEGORIES or c == " ").strip()
    return base[:255] or default


def lm_tokens_needed(req: "SynthesisRequest", prompt_speech_tokens: int = 0) -> int:
    """A lower bound of what one LM call of `req` holds: the fixed tokens, the prompt text (the transcript
    in zero_shot/voice, the instruction in instruct) and the prompt's speech tokens, and one short sentence
    of the text (of a duplex request: one segment) with its longest speech."""
    prompt = (req.instruct_text if req.mode == "instruct"
              else req.prompt_text if req.mode in ("zero_shot", "voice") else "")
    sentence = (LM_DUPLEX_SEGMENT_TOKENS if req.duplex
                else min(len(speakable(req.text or "")), LM_SENTENCE_TOKENS))
    return LM_FIXED_TOKENS + len(prompt or "") + prompt_speech_tokens + sentence * (1 + LM_SPEECH_PER_TEXT_TOKEN)


def check_lm_budget(req: "SynthesisRequest", max_model_len: int | None, prompt_speech_tokens: int = 0) -> None:
    """SynthesisError (400) when the request cannot fit the LM's context (`max_model_len` tokens) however
    the text is split: retrying never helps. The message names the field and says by how much."""
    if not max_model_len:
        return
    need = lm_tokens_needed(req, prompt_speech_tokens)
    if need <= max_model_len:
        return
    over = need - max_model_len
    field = "instruct_text" if req.mode == "instruct" else "prompt_text"
    raise SynthesisError(
        f"{field} is too long for the LM: {len(getattr(req, field) or '')} characters, with the voice prompt's "
        f"{prompt_speech_tokens} speech tokens and room for one sentence, need {need} tokens, but the LM takes "
        f"at most {max_model_len}: shorten {field} by at least {over} characters")
