"""CTC forced alignment: the single best path (Viterbi) of a target sequence through per-frame log-probabilities.

The CTC lattice for targets y_1..y_L has S = 2L + 1 states: blank, y_1, blank, y_2, ..., y_L, blank (state
2j + 1 is target j). A path visits one state per frame, starts in state 0 or 1, ends in state S - 1 or S - 2,
and from state s moves to s (stay), s + 1, or s + 2 when s + 2 is a target that differs from target s (the
blank between two equal targets cannot be skipped). Its score is the sum of the frames' log-probabilities of
its states' labels; we return the path of highest score.

The recursion and tie rule are torchaudio's `forced_align` (its CPU kernel, also shipped by the
`ctc-forced-aligner` package), so on the same emissions our path is theirs, frame for frame (tests/test_align.py
checks it against that package), with one deliberate difference: where s - 1 and s - 2 tie above s, torchaudio
keeps s, the worst of the three, and can return a path that is not a most likely one (pytorch/audio issue
4221); we take s - 1. Otherwise a state keeps its own predecessor unless another is strictly greater (s - 2
before s - 1), and the last frame ends in S - 1 only if it scores strictly above S - 2. Unlike that kernel,
ours has no fixed-size back-pointer buffer to overrun when the audio has few frames to spare.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class AlignmentError(ValueError):
    """The targets cannot be aligned to these frames (too few frames, an id out of range)."""


@dataclass(frozen=True)
class TokenSpan:
    """Target `index` occupies frames start..end (inclusive) of the best path."""

    index: int
    start: int
    end: int


def min_frames(targets: np.ndarray) -> int:
    """The fewest frames a CTC path through `targets` needs: one per target, plus a blank between each
    pair of equal neighbours."""
    t = np.asarray(targets)
    return int(len(t) + np.count_nonzero(t[1:] == t[:-1]))


def forced_align(log_probs: np.ndarray, targets: np.ndarray, blank: int = 0) -> np.ndarray:
    """The best CTC path's state per frame.

    log_probs: (T, C) float32 log-probabilities (or any scores: only sums and comparisons are used);
    targets: (L,) int ids, none equal to `blank`. Returns states (T,) int64 in [0, 2L]: odd 2j + 1 is target j,
    even is a blank. AlignmentError when T is below `min_frames(targets)` or an id is out of range.
    """
    lp = np.ascontiguousarray(log_probs, dtype=np.float32)
    tg = np.asarray(targets, dtype=np.int64)
    if lp.ndim != 2 or tg.ndim != 1:
        raise AlignmentError(f"log_probs must be (T, C) and targets (L,), got {lp.shape} and {tg.shape}")
    num_frames, num_classes = lp.shape
    if not 0 <= blank < num_classes:
        raise AlignmentError(f"blank {blank} is outside the {num_classes} classes")
    if len(tg) and (tg.min() < 0 or tg.max() >= num_classes or (tg == blank).any()):
        raise AlignmentError(f"target ids must be in [0, {num_classes}) and never the blank ({blank})")
    if num_frames < min_frames(tg):
        raise AlignmentError(f"{len(tg)} targets need at least {min_frames(tg)} frames, the audio has {num_frames}")
    num_states = 2 * len(tg) + 1
    labels = np.full(num_states, blank, dtype=np.int64)
    labels[1::2] = tg
    # s - 2 is allowed into target state s unless it is the first target or equals the target before it
    skip = np.zeros(num_states, dtype=bool)
    skip[3::2] = tg[1:] != tg[:-1]
    neg = np.float32(-np.inf)
    alpha = np.full(num_states, neg, dtype=np.float32)
    alpha[0] = lp[0, blank]
    if len(tg):
        alpha[1] = lp[0, tg[0]]
    back = np.zeros((num_frames, num_states), dtype=np.int8)  # 0 stay, 1 from s - 1, 2 from s - 2
    x1 = np.empty(num_states, dtype=np.float32)
    x2 = np.empty(num_states, dtype=np.float32)
    for t in range(1, num_frames):
        x0 = alpha
        x1[0] = neg
        x1[1:] = alpha[:-1]
        x2[:2] = neg
        x2[2:] = alpha[:-2]
        x2[~skip] = neg
        from2 = (x2 > x1) & (x2 > x0)
        from1 = ~from2 & (x1 > x0)  # x1 >= x2 here: the larger of the two (torchaudio also requires x1 > x2)
        best = np.where(from2, x2, np.where(from1, x1, x0))
        back[t] = np.where(from2, 2, np.where(from1, 1, 0))
        alpha = best + lp[t, labels]
    state = num_states - 1 if num_states == 1 or alpha[-1] > alpha[-2] else num_states - 2
    if not np.isfinite(alpha[state]):
        raise AlignmentError("no path through the targets has a finite score (a target never possible)")
    path = np.empty(num_frames, dtype=np.int64)
    for t in range(num_frames - 1, -1, -1):
        path[t] = state
        state -= int(back[t, state])  # a Python int: int8 arithmetic would wrap past 127 states
    return path


def token_spans(path: np.ndarray, num_targets: int) -> list[TokenSpan]:
    """Each target's frames on a state path from `forced_align`: one span per target, in order."""
    frames = np.flatnonzero(path % 2 == 1)
    idx = path[frames] // 2
    spans = []
    for j in range(num_targets):
        at = frames[idx == j]
        spans.append(TokenSpan(j, int(at[0]), int(at[-1])))
    return spans


def label_path(path: np.ndarray, targets: np.ndarray, blank: int = 0) -> np.ndarray:
    """The path's label per frame (torchaudio's and ctc-forced-aligner's form of the result)."""
    labels = np.full(2 * len(targets) + 1, blank, dtype=np.int64)
    labels[1::2] = targets
    return labels[path]


__all__ = ["AlignmentError", "TokenSpan", "forced_align", "label_path", "min_frames", "token_spans"]
