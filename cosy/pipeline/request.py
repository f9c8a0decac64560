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
from dataclasses import dataclass
from typing import Any

from cosy.errors import BadRequest
from cosy.prompt.encoder import PromptFeatures

# zero_shot: 3 s clone (prompt audio + its transcript); cross_lingual: prompt audio only; instruct: prompt
# audio + an instruction; voice: a saved voice; vc: voice conversion (no LM), CLI only.
MODES = ("zero_shot", "cross_lingual", "instruct", "voice", "vc")
SERVED_MODES = MODES[:4]  # what the frontends offer
SPEED_RANGE = (0.5, 2.0)  # the flow's mel-length scaling; beyond it speech breaks down
SEED_RANGE = (0, 2**31 - 1)  # what the LM backends accept as a per-request seed
MAX_TEXT_CHARS = 20000


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

    def check(self) -> "SynthesisRequest":
        """Raise SynthesisError naming the first field that breaks a rule; returns self."""
        if self.mode not in MODES:
            raise SynthesisError(f"unknown mode {self.mode!r} (choose from {', '.join(MODES)})")
        for name in ("text", "prompt_text", "instruct_text"):
            if getattr(self, name) is None:
                setattr(self, name, "")
            if not isinstance(getattr(self, name), str):
                raise SynthesisError(f"{name} must be a string")
        if len(self.text) > MAX_TEXT_CHARS:
            raise SynthesisError(f"text is {len(self.text)} characters; the limit is {MAX_TEXT_CHARS}")
        check_speed(self.speed)
        check_seed(self.seed)
        return self

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


def as_number(value: object, name: str, kind: type = float) -> float | int | None:
    """A number from a loosely typed surface (gradio sends floats for ints, raw API calls anything):
    None stays None; whole floats become ints for `kind=int`; anything else is a SynthesisError naming `name`."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise SynthesisError(f"{name} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise SynthesisError(f"{name} must be a number, got {value!r}")
    if kind is int:
        if float(value) != int(value):
            raise SynthesisError(f"{name} must be a whole number, got {value!r}")
        return int(value)
    return float(value)


def check_speed(speed: object) -> float:
    low, high = SPEED_RANGE
    if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not low <= speed <= high:
        raise SynthesisError(f"speed {speed!r} is out of range ({low} to {high})")
    return float(speed)


def check_seed(seed: object) -> int | None:
    if seed is None:
        return None
    low, high = SEED_RANGE
    if isinstance(seed, bool) or not isinstance(seed, int) or not low <= seed <= high:
        raise SynthesisError(f"seed {seed!r} is out of range ({low} to {high})")
    return seed
