"""A streamed utterance's first chunk apart: its tokens as one backend request, the rest as a second one,
opened only when the frontend asks for the next token, that is once its first chunk is out.

Why: on a machine the backend shares with its frontend, vLLM decodes the rest of the utterance while the
frontend computes the first chunk (flow and HiFT), and both want every core; nothing of that rest is needed
for the first packet. Split, the backend is idle for this stream while the first chunk is computed (the
embedded LM behaves so by itself: it decodes only the tokens it is asked for). Measured on 2 shared cores
(README, One machine): the first packet 3-8 % sooner, the first chunk's flow and HiFT faster by 0.3-0.7 s.
The price is the second request's prefill (the prompt plus the first chunk's tokens: vLLM caches no prefix
of prompt embeddings), so a backend on a machine of its own (`auto` leaves it off for those) gains nothing.

Exactness: the second request continues the same decode: its prompt is the first one's followed by the first
chunk's tokens (as the LM would have fed them), its RAS window starts with them (`cosy_history`), and its
min_len counts them. Only the random draws differ: the rest is seeded with `rest_seed(seed)`, so a seeded
streamed request is reproducible, but draws other tokens than the same request decoded in one piece.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

from torch import Tensor, cat

from cosy.deploy.hosts import all_on_this_machine
from cosy.lm.sampling import SamplingParams

SETTINGS = ("auto", "on", "off")
MAX_SEED = 2**31 - 1


def wanted(setting: str, base_urls: str) -> bool:
    """`--llm_split_first_chunk`: on, off, or auto: on when every backend is on this machine (its host
    resolves to a loopback address; a compose service name does not, so compose.yaml says `on`)."""
    if setting not in SETTINGS:
        raise ValueError(f"--llm_split_first_chunk {setting!r}: must be one of {', '.join(SETTINGS)}")
    if setting != "auto":
        return setting == "on"
    return all_on_this_machine(base_urls)


def rest_seed(seed: int) -> int:
    """The second request's seed: fixed by the first's, away from seed + i (the next sentences' seeds)."""
    return (seed + 0x5DEECE66) % MAX_SEED


def split_decode(lm, embed_speech: Callable[[list[int]], Tensor], prompt_embeds: Tensor, min_len: int,
                 max_len: int, first: int, seed: int, params: SamplingParams) -> Iterator[int]:
    """Yield what `lm.generate(prompt_embeds, min_len, max_len, seed, params)` would (never a stop token),
    as two requests to `lm` (a `BackendPool`): up to `first` tokens, then, when the next one is asked for,
    the rest. `embed_speech`: speech token ids -> (1, n, H) input embeddings."""
    got: list[int] = []
    for token in lm.generate(prompt_embeds, min_len, first, seed=seed, params=params):
        got.append(token)
        yield token
    if len(got) < first:  # a stop token ended it
        return
    rest = cat([prompt_embeds, embed_speech(got).to(prompt_embeds)], dim=1)
    yield from lm.generate(rest, max(0, min_len - first), max_len - first, seed=rest_seed(seed), params=params,
                           history=got)
