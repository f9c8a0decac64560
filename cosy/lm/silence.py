"""The official silent-token rule (`CosyVoice3Model.llm_job`): once more than `max_silent_run` silent tokens
came in a row, further silent ones are dropped from the speech that reaches the flow. The LM itself already
fed them back (its history and KV cache hold them), so the rule applies downstream of any LM, embedded or
remote. A family with no silent tokens (CosyVoice2) passes everything through.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

from cosy.model.family import SpeechTokens


def drop_long_silence(tokens: Iterable[int], speech: SpeechTokens) -> Iterator[int]:
    """`tokens` without the silent ones past a run of `speech.max_silent_run`; closing the result closes
    `tokens` (a remote LM then aborts its request)."""
    if not speech.silent:
        yield from tokens
        return
    silent, limit, run = frozenset(speech.silent), speech.max_silent_run, 0
    try:
        for token in tokens:
            if token in silent:
                run += 1
                if run > limit:
                    continue
            else:
                run = 0
            yield token
    finally:
        close = getattr(tokens, "close", None)
        if close is not None:
            close()


__all__ = ["drop_long_silence"]
