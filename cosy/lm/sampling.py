"""Repetition Aware Sampling (RAS, from VALL-E 2) exactly as the official CosyVoice2 LM draws its tokens.

Official steps for one decode step (`Qwen2LM.sampling_ids` -> `ras_sampling`):
  1. weighted_scores = log_softmax(llm_decoder(h)); before min_len, weighted_scores[tokens.min_len_mask] = -inf
     (CosyVoice2: eos 6561 only: 6562/6563 can still be drawn and end decoding early).
  2. Nucleus draw: probs = softmax(weighted_scores), stable descending sort; walk down the list keeping a
     token while the float32 running sum of the kept probs is < top_p and fewer than top_k are kept; draw
     one with probability proportional to its prob.
  3. If the drawn token y occurs >= win_size * tau_r times in the last win_size outputs, set
     weighted_scores[y] = -inf and draw again from the full softmax.
So, with p_n the nucleus distribution, R the set of tokens over the repetition threshold, and p_f^(-y) the
full softmax without y:  P(x) = p_n(x) [x not in R] + sum_{y in R} p_n(y) p_f^(-y)(x).

Randomness comes only from the caller's torch.Generator (the official code uses the global RNG), a CPU one
whatever the model's device: on a GPU the sampler reads the device once per token (the top_k head of the
sorted probs, values and ids together) and draws on the host, so the same seed draws the same tokens from the
same logits on any device. Only a repeated token's second draw reads the full softmax too. The ids come
from the model family's `SpeechTokens` (`ModelDir(path).family.tokens`), never from constants here.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from cosy.model.config import SamplingParams
from cosy.model.family import SpeechTokens


def _scores(logits: Tensor, mask_eos: bool, tokens: SpeechTokens) -> Tensor:
    """(V,) float32 log-probs, `tokens.min_len_mask` masked if asked (official: log_softmax, then the mask)."""
    scores = logits.float().log_softmax(dim=-1)
    if mask_eos:
        scores[tokens.min_len_mask] = float("-inf")
    return scores


def _nucleus(probs: Tensor, p: SamplingParams) -> tuple[Tensor, Tensor]:
    """Kept probs (float32, not renormalised) and their token ids, in the official order, on the CPU."""
    values, ids = probs.sort(descending=True, stable=True)
    # one read of the device: ids ride along as float32 (exact below 2**24)
    head = torch.stack((values[:p.top_k], ids[:p.top_k].to(values.dtype))).cpu()
    running = np.cumsum(head[0].numpy(), dtype=np.float32)  # sequential float32 sums, like the official loop
    # token i is kept while the sum of the tokens before it is < top_p (the first one always)
    n = 1 + int(np.count_nonzero(running[:-1] < p.top_p)) if p.top_p > 0 else 0
    return head[0, :n], head[1, :n].long()


def _repeated(token: int, history: list[int], p: SamplingParams) -> bool:
    window = history[-p.win_size:] if p.win_size > 0 else []
    return window.count(token) >= p.win_size * p.tau_r


def ras_sample(logits: Tensor, history: list[int], p: SamplingParams, generator: torch.Generator,
               mask_eos: bool, *, tokens: SpeechTokens) -> int:
    """Draw the next token. logits: (V,) raw `llm_decoder` output on any device; history: tokens output so
    far; generator: a CPU one; mask_eos: before min_len (masks `tokens.min_len_mask`)."""
    scores = _scores(logits, mask_eos, tokens)
    if p.greedy:
        return int(scores.argmax())
    kept, ids = _nucleus(scores.softmax(dim=0), p)
    token = int(ids[torch.multinomial(kept, 1, replacement=True, generator=generator)])
    if _repeated(token, history, p):
        scores[token] = float("-inf")
        full = scores.softmax(dim=0).cpu()
        if not bool(torch.isfinite(full).all()):  # y held all the mass: nothing else can be drawn
            return token
        token = int(torch.multinomial(full, 1, replacement=True, generator=generator))
    return token


def ras_distribution(logits: Tensor, history: list[int], p: SamplingParams, mask_eos: bool, *,
                     tokens: SpeechTokens) -> Tensor:
    """The exact distribution of `ras_sample`'s draw, (V,) float64 on the CPU (one-hot when greedy)."""
    scores = _scores(logits, mask_eos, tokens).cpu()
    out = torch.zeros(scores.numel(), dtype=torch.float64)
    if p.greedy:
        out[int(scores.argmax())] = 1.0
        return out
    kept, ids = _nucleus(scores.softmax(dim=0), p)
    p_n = kept.double() / kept.double().sum()
    for prob, token in zip(p_n.tolist(), ids.tolist()):
        if not _repeated(token, history, p):
            out[token] += prob
            continue
        s = scores.clone()
        s[token] = float("-inf")
        full = s.softmax(dim=0).double()
        if not bool(torch.isfinite(full).all()):
            out[token] += prob
            continue
        out += prob * full / full.sum()
    return out
