"""Text normalization backends (ttsfrd, wetext) and the official Chinese/English rules around them.

wetext: the official code pins wetext 0.0.4, which downloads its FSTs from ModelScope at construction
(impossible offline). Later wheels bundle the same FSTs (0.0.7 to 0.1.0 ship identical files) but
changed the Python around them: they strip the output (English loses wetext's trailing space, so
segments end in " ." instead of the official " . .") and read digit-only text as Chinese ("2024" ->
"两千零二十四"). `WetextNormalizer` therefore runs wetext 0.0.4's pipeline itself over the bundled FSTs:
tag, reorder (wetext's TokenParser), verbalize, nothing stripped, and only when the text has a digit.

Bounded work: wetext's FSTs cost about 1 ms per character of English (2.5 ms per digit) and hold the
interpreter while they run, so a worker's other requests stand still meanwhile. A digit run longer than any
number (LONG_DIGITS) is read digit by digit, as both FSTs read such runs, without them; and once a text has
had FST_FREE_SECONDS of FST time, each further piece is followed by a pause as long as it took, so the other
requests of the process keep at least half of it while a number-heavy text is normalized.

ttsfrd (not on PyPI) is used only when importable and given its resource directory.
"""
from __future__ import annotations

import json
import logging
import re
import threading
import time
import unicodedata
from importlib.resources import files
from pathlib import Path
from typing import Callable

__all__ = ["contains_chinese", "zh_rules", "read_long_digit_runs", "NumberSpeller", "WetextNormalizer",
           "TtsfrdNormalizer"]

log = logging.getLogger(__name__)

CHINESE = re.compile(r"[\u4e00-\u9fff]")
DIGIT = re.compile(r"\d")
TRAILING_COMMAS = re.compile(r"[，,、]+$")
# wetext's FSTs cost about 1 ms per character (en) and grow faster than linearly, and the lock is held
# per call. So a text longer than WHOLE_CHARS is normalized in pieces of at most PIECE_CHARS. A piece ends
# after a sentence end, else after a comma or blank, else anywhere outside a digit run; never right before
# a digit, so "Jan. 5th", "45.6" and "1,000" stay whole. Like wetext itself, a piece is normalized only if
# it has a digit. Texts up to WHOLE_CHARS go whole, exactly as officially.
WHOLE_CHARS, PIECE_CHARS = 600, 200
SENTENCE_CUT = re.compile(r"[.!?;:。！？；\n]\s*(?=[^\d\s])")
CLAUSE_CUT = re.compile(r"(?:[，、,]\s*|\s+)(?=[^\d\s])")
# both FSTs read a run of 16 digits or more digit by digit (en: "one two ... oh", zh: "幺二...零"; after a
# decimal point: "point one two", "点一二"): such runs are read so here, without them
LONG_DIGITS = 16
LONG_DIGIT_RUN = re.compile(r"(?:(?<=\d)\.)?\d{%d,}" % LONG_DIGITS)
DIGIT_WORDS = {"en": ("oh", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"),
               "zh": tuple("零幺二三四五六七八九")}
FRACTION_WORDS = {"en": ("point", DIGIT_WORDS["en"]), "zh": ("点", tuple("零一二三四五六七八九"))}
FST_FREE_SECONDS = 1.0  # a text's FST time before it starts to give way (see the module doc)


def contains_chinese(text: str) -> bool:
    """True when any character is in U+4E00..U+9FFF (the official test that picks the zh rules)."""
    return CHINESE.search(text) is not None


def replace_blank(text: str) -> str:
    """Keep a space only when both neighbours are non-space ASCII characters (i.e. between Latin words)."""
    out = []
    for i, c in enumerate(text):
        if c == " ":
            before = text[i - 1] if i > 0 else " "  # the text's ends count as blanks
            after = text[i + 1] if i + 1 < len(text) else " "
            if not (before.isascii() and after.isascii() and before != " " and after != " "):
                continue
        out.append(c)
    return "".join(out)


def zh_rules(text: str) -> str:
    """The official clean-up of normalized Chinese text, in the official order."""
    text = text.replace("\n", "")
    text = replace_blank(text)
    text = text.replace("²", "平方").replace("³", "立方")
    # After TN any "." left is read as a sentence end (official: "v2.1.0" -> "v二。一点零").
    text = text.replace(".", "。").replace(" - ", "，")
    for bracket in ("（", "）", "【", "】", "`"):
        text = text.replace(bracket, "")
    text = text.replace("——", " ")
    return TRAILING_COMMAS.sub("。", text)


_ONES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def _import_inflect():
    """inflect without typeguard's run-time argument checks on its methods: `@typechecked` re-parses
    inflect's whole source once per method at import, 1.5 s of every process start here. We call one
    method with a str, so the checks could never fire; inflect's results are the same."""
    import typeguard

    checked = typeguard.typechecked
    typeguard.typechecked = lambda target=None, **options: target if target is not None else (lambda f: f)
    try:
        import inflect
    finally:
        typeguard.typechecked = checked
    return inflect


class NumberSpeller:
    """The official `spell_out_number`: each run of digits (str.isdigit) becomes English words (inflect).

    inflect is loaded here, once, not on the first request (`_import_inflect`).
    """

    def __init__(self):
        self._engine = _import_inflect().engine()
        self._lock = threading.Lock()  # inflect keeps per-call state on the engine

    def _words(self, digits: str) -> str:
        try:
            with self._lock:
                return self._engine.number_to_words(digits)
        except Exception:  # > 36 digits: inflect gives up (the official code crashes); read digit by digit
            return " ".join(_ONES[int(d)] if d.isdecimal() else d for d in digits)

    def __call__(self, text: str) -> str:
        out, start = [], None
        for i, c in enumerate(text + "\0"):  # the sentinel ends a trailing run
            if c.isdigit():
                start = i if start is None else start
                continue
            if start is not None:
                out.append(self._words(text[start:i]))
                start = None
            out.append(c)
        return "".join(out)[:-1]


def read_long_digit_runs(text: str, lang: str) -> str:
    """`text` with each run of LONG_DIGITS or more digits read digit by digit in `lang` ("zh" or "en") as the
    FSTs read such runs; an English reading keeps blanks between it and the words around it."""
    blank = "" if lang == "zh" else " "

    def read(m: re.Match) -> str:
        run = m.group()
        point, words = FRACTION_WORDS[lang] if run[0] == "." else ("", DIGIT_WORDS[lang])
        spoken = blank.join(([point] if point else []) + [words[unicodedata.decimal(c)] for c in run.lstrip(".")])
        if lang == "en":
            before, after = text[m.start() - 1:m.start()], text[m.end():m.end() + 1]
            spoken = (" " if before and not before.isspace() else "") + spoken + (
                " " if after and not after.isspace() else "")
        return spoken

    return LONG_DIGIT_RUN.sub(read, text)


def _last_cut(pattern: re.Pattern, window: str) -> int:
    """End of the last match of `pattern` in `window` (0 when none)."""
    ends = [m.end() for m in pattern.finditer(window)]
    return ends[-1] if ends else 0


def _hard_cut(window: str) -> int:
    """PIECE_CHARS, moved back to the start of a digit run that crosses it (unless the run is all)."""
    cut = PIECE_CHARS
    while cut > 1 and window[cut - 1].isdigit() and window[cut].isdigit():
        cut -= 1
    return cut if cut > 1 else PIECE_CHARS


def _pieces(text: str) -> list[str]:
    """`text` cut into the pieces that wetext normalizes one by one (one piece when short)."""
    if len(text) <= WHOLE_CHARS:
        return [text]
    pieces = []
    while len(text) > PIECE_CHARS:
        window = text[:PIECE_CHARS + 1]
        cut = _last_cut(SENTENCE_CUT, window) or _last_cut(CLAUSE_CUT, window) or _hard_cut(window)
        pieces.append(text[:cut])
        text = text[cut:]
    return pieces + [text] if text else pieces


class WetextNormalizer:
    """wetext 0.0.4's `Normalizer(lang=auto).normalize` over the FSTs bundled in the installed wetext.

    Loaded once; calls are serialized by a lock (kaldifst's thread safety is undocumented).
    """

    def __init__(self):
        import kaldifst
        from wetext.token_parser import TokenParser

        fsts = files("wetext") / "fsts"
        self._rules: dict[str, tuple[Callable[[str], str], Callable[[str], str]]] = {}
        for lang in ("zh", "en"):
            paths = [fsts / lang / "tn" / name for name in ("tagger.fst", "verbalizer.fst")]
            for path in paths:
                if not path.is_file():
                    raise RuntimeError(f"{path} is missing: install the pinned wetext (wheels 0.0.7 to 0.1.0 "
                                       "bundle the FSTs this frontend reproduces)")
            self._rules[lang] = (kaldifst.TextNormalizer(str(paths[0])), kaldifst.TextNormalizer(str(paths[1])))
        self._token_parser = TokenParser
        self._lock = threading.Lock()

    def _normalize_piece(self, text: str, lang: str) -> str:
        if DIGIT.search(text) is None:  # wetext 0.0.4 leaves digit-free text alone
            return text
        tagger, verbalizer = self._rules[lang]
        try:
            with self._lock:
                tagged = tagger(text)
                if not tagged.strip():  # nothing the tagger could read: TokenParser would assert
                    return text
                return verbalizer(self._token_parser(lang, "tn").reorder(tagged))
        except Exception as e:  # an FST/parse failure must not fail the request: keep the text as it is
            log.warning("wetext could not normalize %r (%s); kept as is", text[:80], e)
            return text

    def __call__(self, text: str, lang: str) -> str:
        """Normalize `text` with the `lang` ("zh" or "en") FSTs (long digit runs without them)."""
        out, spent = [], 0.0
        for piece in _pieces(read_long_digit_runs(text, lang)):
            start = time.thread_time()  # this thread's CPU: the FSTs' work, not a wait for the lock
            out.append(self._normalize_piece(piece, lang))
            took = time.thread_time() - start
            spent += took
            if spent > FST_FREE_SECONDS:  # the other threads of the process get the interpreter as long
                time.sleep(took)
        return "".join(out)


class TtsfrdNormalizer:
    """The ttsfrd engine (pinyinvg mode): normalizes and splits in one call. Calls are serialized."""

    def __init__(self, ttsfrd_dir: str | Path):
        import ttsfrd

        resource = Path(ttsfrd_dir) / "resource"
        self._engine = ttsfrd.TtsFrontendEngine()
        if self._engine.initialize(str(resource)) is not True:
            raise RuntimeError(f"ttsfrd failed to initialize from {resource}")
        self._engine.set_lang_type("pinyinvg")
        self._lock = threading.Lock()

    def __call__(self, text: str) -> list[str]:
        """The sentences ttsfrd makes of `text`."""
        with self._lock:
            result = self._engine.do_voicegen_frd(text)
        return [s["text"] for s in json.loads(result)["sentences"]]
