"""Decode steps of many embedded-LM requests run as one batch (`BatchedLM`, the worker's `--lm_batch`).

One request's decode step reads every weight of the LM to compute one token: on a CPU it is bound by memory
bandwidth, on a GPU by kernel launches, and requests decoded side by side on their own threads pay that once
each (and queue on the GIL). Here each request is prefilled alone on its caller's thread (prompt lengths
differ), with its own KV cache, exactly as `SpeechLM.generate` does; from then on one decode thread runs a
step for every live request at once: projections, MLPs and the LM head as (B, 1, H) batches, attention row by
row over each row's own cache (`decode_step`). Each row draws its token with its own generator, history and
sampling parameters (`ras_sample`), so requests never share randomness.

What it changes: a row's logits equal its solo step's within float rounding, not bit for bit (a batched
matrix product may sum in another order), so under load the same seed can draw another token where two are
nearly tied; alone (one live row) the step is the solo step's arithmetic. Hence opt-in, like vLLM's own
batching for the backend.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import torch
from torch import Tensor

from cosy.lm.model import SpeechLM
from cosy.lm.qwen2 import KVCache, Qwen2Model, RotaryTable, grouped_attention
from cosy.lm.sampling import SamplingParams


def decode_step(model: Qwen2Model, x: Tensor, caches: list[KVCache], ropes: list[RotaryTable]) -> Tensor:
    """x (B, 1, H): each row's next position, after its own cache. Returns the final-normed hidden (B, 1, H)
    and advances every cache by one position (as B calls of `Qwen2Model.forward` would)."""
    b = x.size(0)
    starts = [c.length for c in caches]
    for c, s in zip(caches, starts):
        if s + 1 > c.max_len:
            raise ValueError(f"KV cache full: {s} + 1 positions > {c.max_len}")
    cos = torch.stack([r.cos[s] for r, s in zip(ropes, starts)]).view(b, 1, 1, -1)  # (B, 1, 1, D)
    sin = torch.stack([r.sin[s] for r, s in zip(ropes, starts)]).view(b, 1, 1, -1)
    for layer in model.layers:
        a = layer.self_attn
        q, k, v = a.qkv(layer.input_layernorm(x), cos, sin)  # (B, heads or kv_heads, 1, D)
        rows = []
        for i, (cache, s) in enumerate(zip(caches, starts)):  # each row over its own cache
            k_all, v_all = cache.k[a.layer_idx, :, :, :s + 1], cache.v[a.layer_idx, :, :, :s + 1]
            k_all[:, :, s:].copy_(k[i:i + 1])
            v_all[:, :, s:].copy_(v[i:i + 1])
            rows.append(grouped_attention(q[i:i + 1], k_all, v_all))
        out = torch.cat(rows)  # (B, heads, 1, D)
        x = x + a.o_proj(out.transpose(1, 2).reshape(b, 1, a.n_heads * a.head_dim))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    for c, s in zip(caches, starts):
        c.length = s + 1
    return model.norm(x)


class _Row:
    """One request's decode state: its cache, sampling state and the queue its caller reads tokens from."""

    def __init__(self, lm: SpeechLM, cache: KVCache, rope: RotaryTable, p: SamplingParams,
                 gen: torch.Generator, min_len: int, max_len: int):
        self.lm, self.cache, self.rope, self.p, self.gen = lm, cache, rope, p, gen
        self.min_len, self.max_len = min_len, max_len
        self.history: list[int] = []
        self.stop_ids = lm._stop_ids(p)
        self.out: queue.Queue = queue.Queue()  # tokens, then None (end) or an exception
        self.done = False  # ended, or its caller left: the decode thread drops it

    def take(self, logits: Tensor) -> Tensor | None:
        """Draw the next token from this row's logits (V,); queue it and return its embedding (1, 1, H) to
        feed next, or None when the row has ended (a stop token, or max_len tokens)."""
        token = self.lm._draw(logits, self.history, self.p, self.gen, self.stop_ids,
                              mask_eos=len(self.history) < self.min_len)
        if token is None:
            return self.end()
        self.out.put(token)
        self.history.append(token)
        if len(self.history) >= self.max_len:
            return self.end()
        return self.lm._embed_speech(token)

    def end(self, error: BaseException | None = None) -> None:
        self.done = True
        self.out.put(error)
        return None


class BatchedLM:
    """`SpeechLM` whose `generate` calls, from any number of threads, decode together (at most `max_rows`
    rows a step; more wait for the next step). Everything else is the wrapped LM's (`.lm`)."""

    def __init__(self, lm: SpeechLM, max_rows: int = 8):
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.lm, self.max_rows = lm, max_rows
        self._ready = threading.Condition()
        self._rows: list[tuple[_Row, Tensor]] = []  # (row, the input of its next step)
        self._thread: threading.Thread | None = None

    def __getattr__(self, name):
        return getattr(self.lm, name)

    @torch.inference_mode()
    def generate(self, prompt_embeds: Tensor, min_len: int, max_len: int, seed: int | None = None,
                 params: SamplingParams | None = None) -> Iterator[int]:
        """As `SpeechLM.generate` (same tokens' contract, same seeding)."""
        lm, p = self.lm, params or self.lm.sampling
        gen = torch.Generator()  # on the CPU, as SpeechLM's (cosy.lm.sampling)
        gen.seed() if seed is None else gen.manual_seed(seed)
        if max_len <= 0:
            return
        cache, rope = lm._start(prompt_embeds, max_len)
        row = _Row(lm, cache, rope, p, gen, min_len, max_len)
        logits, _ = lm._step(prompt_embeds, cache, rope)  # the prefill, alone
        x = row.take(logits)
        if x is not None:
            self._add(row, x)
        try:
            while (item := row.out.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            row.done = True  # the caller left (or the row ended): the decode thread drops it

    def _add(self, row: _Row, x: Tensor) -> None:
        with self._ready:
            self._rows.append((row, x))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True, name="lm-decode")
                self._thread.start()
            self._ready.notify()

    @torch.inference_mode()
    def _loop(self) -> None:
        while True:
            with self._ready:
                self._rows = [(r, x) for r, x in self._rows if not r.done]
                while not self._rows:
                    self._ready.wait()
                    self._rows = [(r, x) for r, x in self._rows if not r.done]
                batch = self._rows[:self.max_rows]
                del self._rows[:len(batch)]
            rows = [r for r, _ in batch]
            try:
                h = decode_step(self.lm.llm.model.model, torch.cat([x for _, x in batch]),
                                [r.cache for r in rows], [r.rope for r in rows])
                logits = self.lm.logits(h[:, -1])  # (B, V) float32
                nexts = [r.take(logits[i]) for i, r in enumerate(rows)]
            except Exception as e:  # fails the rows of this step only
                for r in rows:
                    r.end(e)
                continue
            with self._ready:  # behind the rows that waited: a full batch never starves the others
                self._rows += [(r, x) for r, x in zip(rows, nexts) if x is not None and not r.done]
