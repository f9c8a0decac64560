"""The two step backends of `cosy.lm.bistream.decode`: the embedded LM and the vLLM backends.

`EmbeddedSteps` keeps one KV cache for the whole decode and samples in process (`ras_sample`, or any
`sampler(logits, history, mask_eos) -> token`). `RemoteSteps` keeps the fed sequence as embeddings here and
sends one completion request per segment, from the whole prefix, with the out_tokens so far as the RAS
history (`vllm_xargs.cosy_history`, see `cosy.vllm_plugin.ras`): the backend needs no per-decode state, so a
segment may go to any backend of the pool. With `record_logps`, both record each generated token's log-prob
(`logps`, the log_softmax of the raw logits) so decodes can be compared with the official one; serving leaves
it off (a backend asked for log-probs computes them for every token, and vLLM compiles that path on its first
such request).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
from torch import Tensor

from cosy.lm.bistream import Segment
from cosy.lm.model import SpeechLM
from cosy.lm.qwen2 import KVCache, RotaryTable
from cosy.lm.sampling import SamplingParams, ras_sample

Sampler = Callable[[Tensor, list[int], bool], int]  # (logits (V,), history, mask_eos) -> token


class EmbeddedSteps:
    """`StepBackend` on an in-process `SpeechLM` (one decode; not shared between threads)."""

    def __init__(self, lm: SpeechLM, params: SamplingParams | None = None, seed: int | None = None,
                 sampler: Sampler | None = None, capacity: int = 512, record_logps: bool = False):
        self.lm, self.params = lm, params or lm.sampling
        self.record_logps = record_logps
        self.gen = torch.Generator()  # on the CPU: the sampler draws there (cosy.lm.sampling)
        if seed is None:
            self.gen.seed()
        else:
            self.gen.manual_seed(seed)
        self.sampler = sampler or self._ras
        self.cache = KVCache(lm.cfg, capacity, lm.device, lm.dtype)
        self.rope = RotaryTable(lm.cfg, capacity, lm.device, lm.dtype)
        self.logps: list[float] = []

    def _ras(self, logits: Tensor, history: list[int], mask_eos: bool) -> int:
        return ras_sample(logits, history, self.params, self.gen, mask_eos=mask_eos, tokens=self.lm.tokens)

    def _reserve(self, n: int) -> None:
        """Room for n more positions: a cache twice as large (or more), the filled part copied."""
        need = self.cache.length + n
        if need <= self.cache.max_len:
            return
        size = max(need, 2 * self.cache.max_len)
        cache = KVCache(self.lm.cfg, size, self.lm.device, self.lm.dtype)
        cache.k[..., :self.cache.length, :] = self.cache.k[..., :self.cache.length, :]
        cache.v[..., :self.cache.length, :] = self.cache.v[..., :self.cache.length, :]
        cache.length = self.cache.length
        self.cache, self.rope = cache, RotaryTable(self.lm.cfg, size, self.lm.device, self.lm.dtype)

    @torch.inference_mode()
    def run(self, block: Sequence[Segment], history: list[int], max_new: int, mask_eos: bool,
            stop: frozenset[int]) -> Iterator[int]:
        x = self.lm.segments(block)
        for i in range(max_new):
            self._reserve(x.size(1))
            logits, _ = self.lm._step(x, self.cache, self.rope)
            token = self.sampler(logits.clone(), history, mask_eos)
            if self.record_logps:
                self.logps.append(float(logits.log_softmax(-1)[token]))
            yield token
            if token in stop or i == max_new - 1:
                return
            x = self.lm._embed_speech(token)


class RemoteSteps:
    """`StepBackend` on the LM backends (`BackendPool` or `RemoteLM`): one completion request per segment.

    embed: Segments -> (1, L, H) (`PromptEmbedder.segments`). Segment k is seeded `seed + k`."""

    def __init__(self, lm, embed: Callable[[Sequence[Segment]], Tensor], params: SamplingParams | None = None,
                 seed: int | None = None, record_logps: bool = False):
        self.lm, self.embed, self.params = lm, embed, params or lm.sampling
        self.record_logps = record_logps
        self.seed = seed if seed is not None else int(torch.randint(0, 2**31 - 1, (1,)).item())
        self.fed: list[Tensor] = []  # (1, n, H) pieces of the sequence fed so far
        self.requests = 0
        self.logps: list[float] = []

    @property
    def length(self) -> int:
        return sum(x.size(1) for x in self.fed)

    def run(self, block: Sequence[Segment], history: list[int], max_new: int, mask_eos: bool,
            stop: frozenset[int]) -> Iterator[int]:
        self.fed.append(self.embed(block))
        prefix = torch.cat(self.fed, dim=1)
        # eos masked for the whole segment: min_len past max_new
        tokens = self.lm.complete(prefix, max_new, max_new + 1 if mask_eos else 0, sorted(stop),
                                  seed=(self.seed + self.requests) % (2**31 - 1), params=self.params,
                                  history=list(history), logps=self.logps if self.record_logps else None)
        self.requests += 1
        got: list[int] = []
        try:
            for token in tokens:
                got.append(token)
                yield token
                if token in stop:
                    return
        finally:
            tokens.close()
            if len(got) > 1:  # each token was fed before the next was generated; the last one was not
                self.fed.append(self.embed([Segment("speech", tuple(got[:-1]))]))


__all__ = ["EmbeddedSteps", "RemoteSteps", "Sampler"]
