"""What happens to synthesized audio on its way to the encoder: volume, then the requested sample rate.

Resampling is `cosy.audio.resample.resample` (the official band-limited sinc), applied to a stream: a chunk
is resampled together with a little audio on each side, so chunk boundaries add no clicks and the result
equals resampling the whole utterance at once (the test checks it), at the cost of holding back a few
milliseconds of audio until the next chunk or the end.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from cosy.audio.resample import LOWPASS_FILTER_WIDTH, ROLLOFF, resample


class StreamResampler:
    """Resample a stream of (N,) float32 chunks from `orig` to `new` Hz, exactly as one whole signal."""

    def __init__(self, orig: int, new: int):
        self.orig, self.new = int(orig), int(new)
        g = math.gcd(self.orig, self.new)
        self._o, self._n = self.orig // g, self.new // g  # input period / output samples per period
        # filter half-width in input samples (the resampler's own formula), plus a period of slack
        width = math.ceil(LOWPASS_FILTER_WIDTH * self._o / (min(self._o, self._n) * ROLLOFF)) + self._o
        self._margin = self._o * math.ceil(width / self._o)  # whole periods keep output indices aligned
        self._buf = np.zeros(0, np.float32)
        self._done = 0  # input samples at the start of _buf whose output was already emitted

    def _run(self) -> np.ndarray:
        return resample(torch.from_numpy(self._buf), self.orig, self.new).numpy()

    def push(self, chunk: np.ndarray) -> np.ndarray:
        """Output for everything that now has enough audio on both sides."""
        if self.orig == self.new:
            return chunk
        self._buf = np.concatenate([self._buf, np.asarray(chunk, np.float32)])
        end = (len(self._buf) - self._margin) // self._o * self._o  # last input position with full context
        if end <= self._done:
            return np.zeros(0, np.float32)
        out = self._run()[self._done // self._o * self._n: end // self._o * self._n]
        keep_from = max(0, end - self._margin)  # left context for the next call, a whole number of periods
        self._buf, self._done = self._buf[keep_from:], end - keep_from
        return out

    def finish(self) -> np.ndarray:
        """The rest; total output length is ceil(total input * new / orig), like one `resample` call."""
        if self.orig == self.new or len(self._buf) <= self._done:
            return np.zeros(0, np.float32)
        out = self._run()[self._done // self._o * self._n:]
        self._buf, self._done = np.zeros(0, np.float32), 0
        return out


class OutputAudio:
    """Volume and rate conversion for one response: `push(chunk)` and `finish()` give audio to encode."""

    def __init__(self, engine_rate: int, sample_rate: int, volume: float = 1.0):
        self.volume = float(volume)
        self._resampler = StreamResampler(engine_rate, sample_rate)

    def push(self, chunk: np.ndarray) -> np.ndarray:
        chunk = np.asarray(chunk, np.float32)
        if self.volume != 1.0:
            chunk = chunk * np.float32(self.volume)  # clipping happens in the encoder
        return self._resampler.push(chunk)

    def finish(self) -> np.ndarray:
        return self._resampler.finish()
