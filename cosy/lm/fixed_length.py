"""An LM wrapper that produces exactly n speech tokens per request: for benchmarks, so that random weights
(which rarely choose a stop token) cannot skew lengths. Stop tokens are masked; the sampling rule is kept."""
from __future__ import annotations

import dataclasses


class FixedLengthLM:
    """`lm` (SpeechLM, RemoteLM or a BackendPool) with every request's length forced to `n` tokens."""

    def __init__(self, lm, n: int):
        if n < 1:
            raise ValueError(f"fixed token count must be >= 1, got {n}")
        self.lm, self.n, self.sampling = lm, n, lm.sampling

    def generate(self, prompt_embeds, min_len, max_len, seed=None, params=None, **kwargs):
        params = dataclasses.replace(params or self.sampling, ignore_stop=True)
        return self.lm.generate(prompt_embeds, self.n, self.n, seed=seed, params=params, **kwargs)

    def __getattr__(self, name):  # everything else (configure, health, close, ...) is the wrapped LM's
        return getattr(self.lm, name)
