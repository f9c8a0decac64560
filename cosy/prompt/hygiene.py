"""Prompt hygiene on enrollment: a voice prompt made fit to be stored, the same way every time.

    audio, report = clean(audio, rate, Hygiene(too_long="trim"))   # PromptRejected (400) with the reason

The steps, on 20 ms frames of the decoded mono prompt at its own rate (numpy only, no randomness, so the same
prompt gives the same samples byte for byte):

1. clipping: more than `max_clipped` of the samples at full scale (|x| >= `clip_level`) is refused: the
   speaker features would learn the distortion; record it again with less gain.
2. near-silence: a prompt whose loudest frame is below `near_silent_db` dBFS is refused (no voice to take).
3. silence at both ends is trimmed: frames more than `silence_db` below the loudest frame (and any below
   `floor_db`) count as silence; `margin` seconds of it are kept at each end.
4. length: the official front end takes at most 30 s of prompt (`cosy.audio.io.MAX_PROMPT_SECONDS`; its
   speech tokenizer refuses longer audio). A longer prompt is refused (`too_long="refuse"`, the default), or
   cut in the last pause of at least `min_pause` s that starts before the limit (`too_long="trim"`; no such
   pause: refused). A cut prompt must come with the transcript of the part kept (`report["cut_at"]`).
   Speech shorter than `cosy.audio.io.MIN_PROMPT_SECONDS` is refused.
5. loudness: the speech frames' RMS is brought to `target_db` dBFS, the gain limited so that the peak stays
   at most `peak` (no new clipping).

Without hygiene (the caller's choice: `preprocess=false` on `/v1/audio/voices`) the prompt is stored as
decoded, exactly as the PAI reference-audio route and gradio's /save_voice store theirs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from cosy.audio.io import MAX_PROMPT_SECONDS, MIN_PROMPT_SECONDS
from cosy.errors import BadRequest

TOO_LONG = ("refuse", "trim")


class PromptRejected(BadRequest):
    """The prompt cannot be stored as a voice; the message says why and how to fix it (400)."""


@dataclass(frozen=True)
class Hygiene:
    max_seconds: float = MAX_PROMPT_SECONDS
    too_long: Literal["refuse", "trim"] = "refuse"
    frame: float = 0.02  # seconds per analysis frame
    margin: float = 0.1  # seconds of silence kept at each end
    silence_db: float = -35.0  # a frame this far below the loudest one is silence
    floor_db: float = -60.0  # and so is any frame below this (dBFS)
    near_silent_db: float = -45.0  # the loudest frame below this (dBFS): refused
    clip_level: float = 0.999  # |x| at or above: a clipped sample
    max_clipped: float = 0.001  # the share of clipped samples refused
    min_pause: float = 0.2  # seconds of silence a too-long prompt may be cut in
    target_db: float = -20.0  # the speech's RMS after normalization (dBFS)
    peak: float = 0.95  # the highest peak normalization may make


def _db(x: float) -> float:
    return 20 * math.log10(x) if x > 0 else -math.inf


def _frame_db(audio: np.ndarray, n: int) -> np.ndarray:
    """The RMS of each whole frame of `n` samples, in dBFS (the last partial frame counts as a frame)."""
    pad = (-len(audio)) % n
    frames = np.concatenate([audio, np.zeros(pad, audio.dtype)]).astype(np.float64).reshape(-1, n)
    rms = np.sqrt(np.mean(np.square(frames), axis=1))
    with np.errstate(divide="ignore"):
        return 20 * np.log10(rms)


def _last_pause(silent: np.ndarray, before: int, min_frames: int) -> int | None:
    """The first frame of the last run of at least `min_frames` silent frames starting before frame `before`."""
    best, run_start = None, None
    for i, s in enumerate(silent):
        if s and run_start is None:
            run_start = i
        if (not s or i == len(silent) - 1) and run_start is not None:
            end = i + 1 if s else i
            if end - run_start >= min_frames and run_start < before:
                best = run_start
            run_start = None
    return best


def clean(audio: np.ndarray, rate: int, settings: Hygiene) -> tuple[np.ndarray, dict]:
    """The prompt after the module's steps (float32, same rate), and what was done (JSON-ready seconds
    and dB). PromptRejected naming the reason."""
    if settings.too_long not in TOO_LONG:
        raise PromptRejected(f"too_long must be one of {', '.join(TOO_LONG)}")
    audio = np.asarray(audio, dtype=np.float32)
    seconds_in = len(audio) / rate
    clipped = float(np.count_nonzero(np.abs(audio) >= settings.clip_level)) / max(1, len(audio))
    if clipped > settings.max_clipped:
        raise PromptRejected(f"the prompt is clipped: {100 * clipped:.2g} % of the samples are at full scale; "
                             "record it again with less input gain")
    n = max(1, round(settings.frame * rate))
    frame_db = _frame_db(audio, n)
    top = float(frame_db.max()) if len(frame_db) else -math.inf
    if top < settings.near_silent_db:
        level = "-inf" if not math.isfinite(top) else f"{top:.0f}"
        raise PromptRejected(f"the prompt is near-silent: its loudest {settings.frame * 1000:.0f} ms is {level} dBFS "
                             f"(at least {settings.near_silent_db:g} dBFS is needed): record closer to the microphone")
    silent = frame_db < max(top + settings.silence_db, settings.floor_db)
    active = np.flatnonzero(~silent)
    first, last = int(active[0]), int(active[-1])
    if (last + 1 - first) * n / rate < MIN_PROMPT_SECONDS:
        raise PromptRejected(f"the prompt's speech is too short ({(last + 1 - first) * n / rate:.2f} s without the "
                             f"silence around it); a prompt needs at least {MIN_PROMPT_SECONDS:g} s")
    keep = round(settings.margin * rate)
    start, end = max(0, first * n - keep), min(len(audio), (last + 1) * n + keep)
    cut_at = None
    if (end - start) / rate > settings.max_seconds:
        if settings.too_long == "refuse":
            raise PromptRejected(
                f"the prompt is {(end - start) / rate:.1f} s; the limit is {settings.max_seconds:g} s (the official "
                f"front end's): send a shorter one, or too_long=trim to cut it in its last pause before "
                f"{settings.max_seconds:g} s (then send the transcript of the part kept)")
        limit = start + round(settings.max_seconds * rate) - keep  # a pause starting here still fits its margin
        pause = _last_pause(silent, limit // n, max(1, round(settings.min_pause / settings.frame)))
        if pause is None or pause * n <= first * n:
            raise PromptRejected(f"the prompt is {(end - start) / rate:.1f} s and has no pause of "
                                 f"{settings.min_pause:g} s or more in its first {settings.max_seconds:g} s to cut "
                                 "it at: send a shorter one")
        end = pause * n + keep
        cut_at = end / rate
    out = audio[start:end].astype(np.float64)
    kept = slice(start // n, math.ceil(end / n))
    voiced = frame_db[kept][~silent[kept]]  # the speech's loudness, without the pauses in it
    speech_rms_db = 10 * math.log10(float(np.mean(10 ** (voiced / 10))))
    peak = float(np.abs(out).max())
    gain_db = min(settings.target_db - speech_rms_db, _db(settings.peak / peak))
    out = (out * 10 ** (gain_db / 20)).astype(np.float32)
    report = {"seconds_in": round(seconds_in, 3), "seconds": round(len(out) / rate, 3),
              "trimmed_start": round(start / rate, 3), "trimmed_end": round((len(audio) - end) / rate, 3),
              "cut_at": None if cut_at is None else round(cut_at, 3),
              "gain_db": round(gain_db, 2)}
    return out, report
