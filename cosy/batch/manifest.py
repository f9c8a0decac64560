"""A batch manifest: JSON Lines, one utterance a line, read into typed items (or the reason a line is bad).

    {"id": "u001", "text": "你好", "voice_id": "alice"}
    {"id": "u002", "text": "Hello", "prompt_wav": "prompts/bob.wav", "prompt_text": "...", "seed": 7}
    {"id": "u003", "text": "...", "mode": "instruct", "prompt_wav": "bob.wav", "instruct_text": "用四川话说这句话"}
    {"id": "u004", "text": "...", "prompt_wav": "bob.wav", "format": "mp3", "sample_rate": 16000, "speed": 1.1}
    {"id": "u005", "text": "<speak>你好<break time=\"300ms\"/>再见</speak>", "voice_id": "alice", "ssml": true}

`mode` defaults to `voice` with a `voice_id`, else `zero_shot` with a `prompt_text`, else `cross_lingual`.
Relative `prompt_wav` paths are read from the manifest's folder. A line is assigned to a shard by its number
(line k, counting from 0, goes to shard k % n), so shards split the manifest however its lines look.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from cosy.errors import BadRequest
from cosy.frontend.encoding import FORMATS
from cosy.pipeline.request import (
    SAMPLE_RATE_RANGE,
    SERVED_MODES,
    SynthesisError,
    SynthesisRequest,
    check_range,
)

# ids become file names: 1-128 of [A-Za-z0-9_.-], starting with a letter or digit
ITEM_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
FIELDS = ("id", "text", "mode", "voice_id", "prompt_wav", "prompt_text", "instruct_text", "speed", "seed",
          "format", "sample_rate", "ssml")


@dataclass
class BatchItem:
    """One good manifest line: the request to run and how to write its audio."""

    id: str
    line: int  # 1-based, for messages
    request: SynthesisRequest
    format: str = "wav"
    sample_rate: int = 24000

    @property
    def file_name(self) -> str:
        return f"{self.id}.{self.format}"


@dataclass
class BadLine:
    """A manifest line that cannot run: reported in the results file, the rest goes on."""

    id: str | None  # None when the line has no usable id
    line: int
    error: str


def parse_line(raw: str, number: int, base: Path, default_rate: int) -> BatchItem | BadLine:
    """One manifest line (`number`: 1-based); paths relative to `base`. Checks what can be checked without
    the model (fields, types, ranges, files exist); the rest (voices, the LM budget) fails at synthesis."""
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        return BadLine(None, number, f"line {number} is not JSON: {e.msg} (column {e.colno})")
    if not isinstance(obj, dict):
        return BadLine(None, number, f"line {number} is not a JSON object")
    item_id = obj.get("id")
    if not isinstance(item_id, str) or not ITEM_ID.fullmatch(item_id) or ".." in item_id:
        return BadLine(None, number, f"line {number}: id {item_id!r} is missing or invalid: use 1-128 letters, "
                                     "digits, '_', '-' or '.', starting with a letter or digit")
    try:
        return _item(obj, item_id, number, base, default_rate)
    except BadRequest as e:  # SynthesisError, SsmlError (with the line and column in the text)
        return BadLine(item_id, number, str(e))


def _item(obj: dict, item_id: str, number: int, base: Path, default_rate: int) -> BatchItem:
    unknown = sorted(set(obj) - set(FIELDS))
    if unknown:
        raise SynthesisError(f"unknown field(s) {', '.join(unknown)} (known: {', '.join(FIELDS)})")
    for name in ("text", "mode", "voice_id", "prompt_wav", "prompt_text", "instruct_text", "format"):
        if obj.get(name) is not None and not isinstance(obj[name], str):
            raise SynthesisError(f"{name} must be a string, got {type(obj[name]).__name__}")
    prompt_wav = obj.get("prompt_wav") or None
    if prompt_wav is not None:
        path = Path(prompt_wav).expanduser()
        prompt_wav = path if path.is_absolute() else base / path
        if not prompt_wav.is_file():
            raise SynthesisError(f"prompt_wav {obj['prompt_wav']!r} is not a file")
    voice_id = obj.get("voice_id") or None
    mode = obj.get("mode") or ("voice" if voice_id else "zero_shot" if obj.get("prompt_text") else "cross_lingual")
    if mode not in SERVED_MODES:
        raise SynthesisError(f"unknown mode {mode!r} (choose from {', '.join(SERVED_MODES)})")
    if not voice_id and prompt_wav is None:
        raise SynthesisError("needs a voice: voice_id, or prompt_wav (with prompt_text for zero_shot)")
    fmt = obj.get("format") or "wav"
    if fmt not in FORMATS or fmt == "pcm":
        raise SynthesisError(f"unsupported format {fmt!r}: use one of {', '.join(f for f in FORMATS if f != 'pcm')}")
    rate = default_rate if obj.get("sample_rate") is None else check_range(obj["sample_rate"], "sample_rate",
                                                                           *SAMPLE_RATE_RANGE, kind=int)
    speed = 1.0 if obj.get("speed") is None else check_range(obj["speed"], "speed", 0.0, 1e9)
    ssml = obj.get("ssml", False)
    if not isinstance(ssml, bool):
        raise SynthesisError(f"ssml must be true or false, got {ssml!r}")
    seed = obj.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise SynthesisError(f"seed must be a whole number, got {seed!r}")
    req = SynthesisRequest(mode=mode, text=obj.get("text") or "", prompt_text=obj.get("prompt_text") or "",
                           prompt_wav=prompt_wav, instruct_text=obj.get("instruct_text") or "",
                           voice_id=voice_id, speed=speed, seed=seed, ssml=ssml).check()
    return BatchItem(item_id, number, req, fmt, int(rate))


def read_manifest(path: Path, shard: tuple[int, int] = (0, 1), default_rate: int = 24000
                  ) -> list[BatchItem | BadLine]:
    """This shard's lines of `path`, in order (blank lines skipped, still counted); a repeated id is a
    BadLine naming the line that has it first."""
    index, count = shard
    out: list[BatchItem | BadLine] = []
    first: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for k, raw in enumerate(f):
            if not raw.strip():
                continue
            entry = parse_line(raw, k + 1, path.parent, default_rate)
            if entry.id is not None:
                if entry.id in first:
                    entry = BadLine(entry.id, k + 1, f"line {k + 1}: id {entry.id!r} repeats line {first[entry.id]}")
                    entry.id = None  # the first line's results and file stay that line's
                else:
                    first[entry.id] = k + 1
            if k % count == index:
                out.append(entry)
    return out


def parse_shard(value: str) -> tuple[int, int]:
    """'i/n' (0 <= i < n) -> (i, n); ValueError naming the problem."""
    m = re.fullmatch(r"(\d+)/(\d+)", value.strip())
    if not m or int(m[2]) < 1 or int(m[1]) >= int(m[2]):
        raise ValueError(f"--shard {value!r}: use i/n with 0 <= i < n, e.g. 0/4")
    return int(m[1]), int(m[2])
