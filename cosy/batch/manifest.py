"""A batch manifest: JSON Lines, one utterance a line, read into typed items (or the reason a line is bad).

    {"id": "u001", "text": "你好", "voice_id": "alice"}
    {"id": "u002", "text": "Hello", "prompt_wav": "prompts/bob.wav", "prompt_text": "...", "seed": 7}
    {"id": "u003", "text": "...", "mode": "instruct", "prompt_wav": "bob.wav", "instruct_text": "用四川话说这句话"}
    {"id": "u004", "text": "...", "prompt_wav": "bob.wav", "format": "mp3", "sample_rate": 16000, "speed": 1.1}
    {"id": "u005", "text": "<speak>你好<break time=\"300ms\"/>再见</speak>", "voice_id": "alice", "ssml": true}
    {"id": "u006", "text": "去重庆", "voice_id": "alice", "hot_fix": {"pronunciation": [{"重庆": "chong2 qing4"}]}}
    {"id": "u007", "text": "你好。明天见！", "voice_id": "alice", "subtitles": "srt"}

`mode` defaults to `voice` with a `voice_id`, else `zero_shot` with a `prompt_text`, else `cross_lingual`.
Relative `prompt_wav` paths are read from the manifest's folder. `subtitles` ("srt" | "vtt"; default the
batch's `--subtitles`, else none) asks for a subtitle file beside the audio. A line is assigned to a shard by
its number (line k, counting from 0, goes to shard k % n), so shards split the manifest however its lines look. Any
line, however malformed (not UTF-8, not JSON, nested too deeply, huge numbers, a format its rate cannot be
encoded in), is a `BadLine` with the reason; a good line carries a digest of what it asks for, so a result
recorded for an earlier version of the line is done again.
"""
from __future__ import annotations

import codecs
import functools
import hashlib
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from cosy.errors import BadRequest
from cosy.frontend.encoding import FORMATS, EncodingError, make_encoder
from cosy.pipeline.request import (
    SAMPLE_RATE_RANGE,
    SERVED_MODES,
    SynthesisError,
    SynthesisRequest,
    check_range,
)
from cosy.pipeline.subtitles import FORMATS as SUBTITLE_FORMATS
from cosy.text.language import check_language
from cosy.text.lexicon import parse_hot_fix

# ids become file names: 1-128 of [A-Za-z0-9_.-], starting with a letter or digit
ITEM_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
FIELDS = ("id", "text", "mode", "voice_id", "prompt_wav", "prompt_text", "instruct_text", "speed", "seed",
          "format", "sample_rate", "ssml", "hot_fix", "language_hints", "enable_markdown_filter",
          "subtitles")
MAX_LINE_BYTES = 1 << 20  # a line holds at most 20,000 characters of text and a few short fields
SHOWN = 100  # characters of a value a message quotes


def record_key(item_id: str | None, line: int) -> str:
    """A line's key in the results: its id, or for a line without a usable id its number."""
    return item_id if item_id is not None else f"line:{line}"


@dataclass
class BatchItem:
    """One good manifest line: the request to run, how to write its audio, and `digest`, a fingerprint of
    what the line asks for (its fields with their defaults filled in, the prompt file's content): a result
    recorded for another digest is redone."""

    id: str
    line: int  # 1-based, for messages
    request: SynthesisRequest
    format: str = "wav"
    sample_rate: int = 24000
    digest: str = ""
    subtitles: str | None = None  # "srt" | "vtt": a subtitle file beside the audio

    @property
    def file_name(self) -> str:
        return f"{self.id}.{self.format}"

    @property
    def subtitle_name(self) -> str | None:
        return f"{self.id}.{self.subtitles}" if self.subtitles else None

    @property
    def key(self) -> str:
        return self.id


@dataclass
class BadLine:
    """A manifest line that cannot run: reported in the results file, the rest goes on."""

    id: str | None  # None when the line has no usable id
    line: int
    error: str

    @property
    def key(self) -> str:
        return record_key(self.id, self.line)


def shown(value: object) -> str:
    """`value` as a message quotes it: its repr, cut at SHOWN characters."""
    text = repr(value)
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(text)} characters)"


@functools.lru_cache(maxsize=64)
def output_problem(fmt: str, rate: int) -> str | None:
    """Why the encoders cannot write `fmt` at `rate` Hz (their own rule: opus's rates, ...), or None."""
    try:
        make_encoder(fmt, rate, streaming=False).close()
    except EncodingError as e:
        return str(e)
    return None


def file_digest(path: Path, cache: dict | None = None) -> str:
    """sha256 of a file's content (`cache`: by path, size and mtime, so a prompt many lines share is read
    once)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if cache is not None and key in cache:
        return cache[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    if cache is not None:
        cache[key] = h.hexdigest()
    return h.hexdigest()


def parse_line(raw: str | bytes, number: int, base: Path, default_rate: int,
               prompts: dict | None = None, subtitles: str | None = None) -> BatchItem | BadLine:
    """One manifest line (`number`: 1-based); paths relative to `base`; `prompts`: the prompt files' digests
    by file, shared by the lines of one manifest; `subtitles`: the format of lines without their own. Checks
    what can be checked without the model (fields, types, ranges, files exist, the output format at its rate,
    the subtitle format); the rest (voices, the LM budget) fails at
    synthesis. Whatever the line holds, the answer is an item or a BadLine that says why."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            return BadLine(None, number, f"line {number} is not UTF-8 text (byte {e.start + 1} is "
                                         f"0x{raw[e.start]:02x}): save the manifest as UTF-8")
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        return BadLine(None, number, f"line {number} is not JSON: {e.msg} (column {e.colno})")
    except RecursionError:
        return BadLine(None, number, f"line {number} is not a manifest line: its JSON is nested too deeply")
    except ValueError:  # a whole number longer than Python converts
        return BadLine(None, number, f"line {number} holds a number of more than {sys.get_int_max_str_digits()} "
                                     "digits")
    if not isinstance(obj, dict):
        return BadLine(None, number, f"line {number} is not a JSON object")
    item_id = obj.get("id")
    if not isinstance(item_id, str) or not ITEM_ID.fullmatch(item_id) or ".." in item_id:
        return BadLine(None, number, f"line {number}: id {shown(item_id)} is missing or invalid: use 1-128 "
                                     "letters, digits, '_', '-' or '.', starting with a letter or digit")
    try:
        return _item(obj, item_id, number, base, default_rate, prompts, subtitles)
    except BadRequest as e:  # SynthesisError, SsmlError (with the line and column in the text)
        return BadLine(item_id, number, str(e))


def _item(obj: dict, item_id: str, number: int, base: Path, default_rate: int, prompts: dict | None,
          default_subtitles: str | None = None) -> BatchItem:
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        names = ", ".join(shown(u)[1:-1] for u in unknown[:5])
        names += f" and {len(unknown) - 5} more" if unknown[5:] else ""
        raise SynthesisError(f"unknown field(s) {names} (known: {', '.join(FIELDS)})")
    for name in ("text", "mode", "voice_id", "prompt_wav", "prompt_text", "instruct_text", "format"):
        if obj.get(name) is not None and not isinstance(obj[name], str):
            raise SynthesisError(f"{name} must be a string, got {type(obj[name]).__name__}")
    prompt_wav = obj.get("prompt_wav") or None
    prompt_digest = None
    if prompt_wav is not None:
        path = Path(prompt_wav).expanduser()
        prompt_wav = path if path.is_absolute() else base / path
        try:
            if not prompt_wav.is_file():
                raise SynthesisError(f"prompt_wav {shown(obj['prompt_wav'])} is not a file")
            prompt_digest = file_digest(prompt_wav, prompts)
        except OSError as e:  # a name too long, a folder it may not read, ...
            raise SynthesisError(f"prompt_wav {shown(obj['prompt_wav'])} cannot be read: "
                                 f"{e.strerror or e}") from None
    voice_id = obj.get("voice_id") or None
    mode = obj.get("mode") or ("voice" if voice_id else "zero_shot" if obj.get("prompt_text") else "cross_lingual")
    if mode not in SERVED_MODES:
        raise SynthesisError(f"unknown mode {shown(mode)} (choose from {', '.join(SERVED_MODES)})")
    if not voice_id and prompt_wav is None:
        raise SynthesisError("needs a voice: voice_id, or prompt_wav (with prompt_text for zero_shot)")
    fmt = obj.get("format") or "wav"
    if fmt not in FORMATS or fmt == "pcm":
        raise SynthesisError(f"unsupported format {shown(fmt)}: use one of "
                             f"{', '.join(f for f in FORMATS if f != 'pcm')}")
    rate = int(default_rate if obj.get("sample_rate") is None
               else check_range(obj["sample_rate"], "sample_rate", *SAMPLE_RATE_RANGE, kind=int))
    problem = output_problem(fmt, rate)
    if problem:
        raise SynthesisError(problem + ("" if obj.get("sample_rate") is not None else
                                        " (the rate is --sample_rate's: give the line a sample_rate)"))
    subtitles = default_subtitles if obj.get("subtitles") is None else obj["subtitles"]
    if subtitles is not None and subtitles not in SUBTITLE_FORMATS:
        raise SynthesisError(f"subtitles {shown(subtitles)} is not a subtitle format: use one of "
                             f"{', '.join(SUBTITLE_FORMATS)}, or leave the field out for none")
    speed = 1.0 if obj.get("speed") is None else check_range(obj["speed"], "speed", 0.0, 1e9)
    ssml = obj.get("ssml", False)
    if not isinstance(ssml, bool):
        raise SynthesisError(f"ssml must be true or false, got {shown(ssml)}")
    markdown = obj.get("enable_markdown_filter", False)
    if not isinstance(markdown, bool):
        raise SynthesisError(f"enable_markdown_filter must be true or false, got {shown(markdown)}")
    seed = obj.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise SynthesisError(f"seed must be a whole number, got {shown(seed)}")
    req = SynthesisRequest(mode=mode, text=obj.get("text") or "", prompt_text=obj.get("prompt_text") or "",
                           prompt_wav=prompt_wav, instruct_text=obj.get("instruct_text") or "",
                           voice_id=voice_id, speed=speed, seed=seed, ssml=ssml,
                           hot_fix=parse_hot_fix(obj.get("hot_fix")),
                           language=check_language(obj.get("language_hints")), markdown=markdown).check()
    asked = {"mode": mode, "text": req.text, "prompt_text": req.prompt_text, "instruct_text": req.instruct_text,
             "voice_id": voice_id, "prompt": prompt_digest, "speed": float(speed), "seed": seed, "ssml": ssml,
             "format": fmt, "sample_rate": rate}
    if req.language or req.markdown:  # (as hot_fix: a line without them keeps its digest)
        asked.update(language_hints=req.language, enable_markdown_filter=req.markdown)
    if req.hot_fix:  # (a line without one keeps the digest it had before the field existed)
        asked["hot_fix"] = [e.to_dict() for e in req.hot_fix]
    if subtitles:  # (as hot_fix) a line asking for subtitles is redone; its record holds the sentences
        asked["subtitles"] = subtitles
    digest = hashlib.sha256(json.dumps(asked, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:16]
    return BatchItem(item_id, number, req, fmt, rate, digest, subtitles)


def read_manifest(path: Path, shard: tuple[int, int] = (0, 1), default_rate: int = 24000,
                  subtitles: str | None = None) -> list[BatchItem | BadLine]:
    """This shard's lines of `path`, in order (blank lines skipped, still counted); a repeated id is a
    BadLine naming the line that has it first; `subtitles`: the format of lines without their own. Any line,
    however malformed, is an entry."""
    index, count = shard
    out: list[BatchItem | BadLine] = []
    first: dict[str, int] = {}
    prompts: dict = {}
    for k, raw in enumerate(_lines(path)):
        if raw is None:
            entry: BatchItem | BadLine = BadLine(None, k + 1, f"line {k + 1} is longer than "
                                                              f"{MAX_LINE_BYTES >> 20} MiB")
        elif not raw.strip():
            continue
        else:
            entry = parse_line(raw, k + 1, path.parent, default_rate, prompts, subtitles)
        if entry.id is not None:
            if entry.id in first:
                entry = BadLine(None, k + 1, f"line {k + 1}: id {entry.id!r} repeats line {first[entry.id]}")
                # the first line's results and file stay that line's
            else:
                first[entry.id] = k + 1
        if k % count == index:
            out.append(entry)
    return out


def _lines(path: Path):
    """The manifest's lines as bytes (a UTF-8 byte order mark dropped), None for a line over MAX_LINE_BYTES
    (read past, never held whole)."""
    with open(path, "rb") as f:
        k = 0
        while raw := f.readline(MAX_LINE_BYTES + 1):
            if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
                while (rest := f.readline(MAX_LINE_BYTES)) and not rest.endswith(b"\n"):
                    pass
                raw = None
            elif k == 0 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]
            k += 1
            yield raw


def parse_shard(value: str) -> tuple[int, int]:
    """'i/n' (0 <= i < n) -> (i, n); ValueError naming the problem."""
    m = re.fullmatch(r"(\d+)/(\d+)", value.strip())
    if not m or int(m[2]) < 1 or int(m[1]) >= int(m[2]):
        raise ValueError(f"--shard {value!r}: use i/n with 0 <= i < n, e.g. 0/4")
    return int(m[1]), int(m[2])
