"""How a stream's mel chunks become audio chunks: the vocoder semantics of a model family's streaming.

Each stream owns one of these (per-request state); the family names the class (`ModelFamily.stream_vocoder`):
  * `CrossfadeVocoder` (CosyVoice2): HiFT is not causal, so each chunk is vocoded with the previous chunk's
    last 8 mel frames and their source in front, and the overlap is crossfaded with a Hamming window.
  * `RevocodeVocoder` (CosyVoice3, as the official computes it): the causal HiFT re-vocodes the WHOLE mel so
    far (`finalize=False` until the last chunk) and only the samples past those already emitted are
    returned; no fade, no source cache. Its cost grows with the square of the utterance's length.
  * `CausalStreamVocoder` (CosyVoice3, served): the same samples, within float rounding, in linear time.
    HiFT is causal with a finite reach to the left, so each chunk re-vocodes only its new frames plus
    `decode_context_frames` before them; the f0 of finished frames is kept (each new frame's f0 computed
    from `f0_context_frames` before it) and the sine phase integrates the whole f0 so far (cheap: frame rate).
All take mel frames (1, 80, n) in order and return (N,) float32 CPU audio.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

MEL_CACHE_FRAMES = 8  # mel frames HiFT re-decodes at the start of the next chunk (CosyVoice2)


def crossfade(head: Tensor, previous_tail: Tensor, window: Tensor) -> Tensor:
    """Blend the first len(window)//2 samples of `head` (B, N) with `previous_tail` (B, >= len//2).

    `window` is a symmetric window of even length 2L: its rising half weighs the new audio, its falling
    half the old tail.
    """
    overlap = window.shape[0] // 2
    out = head.clone()
    out[:, :overlap] = head[:, :overlap] * window[:overlap] + previous_tail[:, -overlap:] * window[overlap:]
    return out


def hamming_window(hift: nn.Module, device: torch.device) -> Tensor:
    """np.hamming (symmetric) over two mel-cache lengths of samples, as the official crossfade uses."""
    n = 2 * MEL_CACHE_FRAMES * hift.cfg.upsample_scale
    return torch.hamming_window(n, periodic=False, dtype=torch.float64).float().to(device)


@dataclass
class VocodeJob:
    """One stream's HiFT step, batchable with other streams' steps of the same shape
    (`Token2Wav.run_vocode`): HiFT of `mel` (1, 80, T) with `cache_source` (1, 1, L) or None and the
    stream's `generator`, then `finish(speech (1, T*480), source (1, 1, T*480))` -> the chunk's audio."""

    mel: Tensor
    cache_source: Tensor | None
    generator: torch.Generator
    finish: Callable[[Tensor, Tensor], Tensor]

    @property
    def shape(self) -> tuple[int, int]:
        """Rows of equal shape run as one batch: (mel frames, cached source samples)."""
        return self.mel.shape[2], 0 if self.cache_source is None else self.cache_source.shape[2]


class CrossfadeVocoder:
    """CosyVoice2's streaming HiFT: mel/source cache of 8 frames and a crossfade between chunks."""

    def __init__(self, hift: nn.Module, generator: torch.Generator, window: Tensor):
        self.hift, self.generator, self.window = hift, generator, window
        self.cache_len = MEL_CACHE_FRAMES * hift.cfg.upsample_scale
        self.cache: tuple[Tensor, Tensor, Tensor] | None = None  # (mel, source, speech tail)

    @property
    def empty(self) -> bool:
        """Whether nothing was vocoded yet."""
        return self.cache is None

    def push(self, mel: Tensor, finalize: bool) -> Tensor:
        job = self.job(mel, finalize)
        if job is None:
            return torch.zeros(0)
        speech, source = self.hift.inference(job.mel, cache_source=job.cache_source, generator=job.generator)
        return job.finish(speech, source)

    def job(self, mel: Tensor, finalize: bool) -> VocodeJob | None:
        """`push` as a batchable HiFT step (None: nothing to vocode). Its `finish` updates this stream's
        cache, so run exactly one of `push` and the job, once."""
        cache_source = None
        if self.cache is not None:
            mel = torch.cat([self.cache[0], mel], dim=2)
            cache_source = self.cache[1]
        if mel.shape[2] == 0:
            return None

        def finish(speech: Tensor, source: Tensor) -> Tensor:
            if self.cache is not None:
                speech = crossfade(speech, self.cache[2], self.window.to(speech))
            if not finalize:
                n = self.cache_len
                self.cache = (mel[:, :, -MEL_CACHE_FRAMES:], source[:, :, -n:], speech[:, -n:])
                speech = speech[:, :-n]
            return speech[0].float().cpu()
        return VocodeJob(mel, cache_source, self.generator, finish)


class RevocodeVocoder:
    """CosyVoice3's streaming HiFT: re-vocode all mel so far, emit what lies past the samples already out.

    A non-final call needs more than the vocoder's context frames (`hift.context_frames`, 7) to emit
    anything; with fewer the frames wait for the next chunk.
    """

    def __init__(self, hift: nn.Module, generator: torch.Generator | None = None, window: Tensor | None = None):
        self.hift = hift
        self.mel: Tensor | None = None  # (1, 80, frames so far)
        self.offset = 0  # samples emitted

    @property
    def empty(self) -> bool:
        return self.mel is None

    def job(self, mel: Tensor, finalize: bool) -> None:
        """Not batchable: each stream re-vocodes its whole mel so far, of its own length."""
        return None

    def push(self, mel: Tensor, finalize: bool) -> Tensor:
        self.mel = mel if self.mel is None else torch.cat([self.mel, mel], dim=2)
        frames = self.mel.shape[2]
        if frames == 0 or (not finalize and frames <= self.hift.context_frames):
            return torch.zeros(0)
        speech, _ = self.hift.inference(self.mel, finalize=finalize)
        new = speech[0, self.offset:]
        self.offset = max(self.offset, speech.shape[1])
        return new.float().cpu()


class CausalStreamVocoder(RevocodeVocoder):
    """`RevocodeVocoder`'s output at the cost of the new frames: see the module docstring. Holds the mel
    from the first frame a later chunk can need (`base` on), the f0 of every finished frame, and the count
    of samples out. Not batchable either: each stream's window has its own f0 and phase."""

    def __init__(self, hift: nn.Module, generator: torch.Generator | None = None, window: Tensor | None = None):
        super().__init__(hift)
        self.scale = hift.cfg.upsample_scale
        self.base = 0  # the utterance frame self.mel starts at
        self.f0: Tensor | None = None  # (1, F): f0 of frames 0..F-1, final values

    def push(self, mel: Tensor, finalize: bool) -> Tensor:
        hift = self.hift
        self.mel = mel if self.mel is None else torch.cat([self.mel, mel], dim=2)
        frames = self.base + self.mel.shape[2]
        if frames == 0 or (not finalize and frames <= hift.context_frames):
            return torch.zeros(0)
        done = 0 if self.f0 is None else self.f0.shape[1]
        f0_from = max(0, done - hift.f0_context_frames)  # the f0 of frames >= done is exact from here on
        f0 = hift.predict_f0(self.mel[:, :, f0_from - self.base:], finalize)[:, done - f0_from:]
        self.f0 = f0 if self.f0 is None else torch.cat([self.f0, f0], dim=1)
        voiced = self.f0.shape[1]  # frames with f0 (not final: all but the f0 predictor's look-ahead)
        start = max(0, self.offset // self.scale - hift.decode_context_frames)
        x = self.mel[:, :, start - self.base:voiced - self.base]
        speech = hift.decode(x, hift.source(self.f0, start=start), finalize)
        new = speech[0, self.offset - start * self.scale:]
        self.offset = max(self.offset, start * self.scale + speech.shape[1])
        # what the next chunk reads: its decode window and the f0 predictor's context
        keep = min(max(0, self.offset // self.scale - hift.decode_context_frames),
                   max(0, voiced - hift.f0_context_frames))
        self.mel, self.base = self.mel[:, :, keep - self.base:], keep
        return new.float().cpu()
