"""Text-in streaming ("bistream") LM decoding with the official CosyVoice2 semantics (`Qwen2LM.inference_bistream`).

Text arrives in pieces (lists of text ids). The control flow below is written once; what runs the network is a
`StepBackend`: the embedded LM (`cosy.lm.bistream_steps.EmbeddedSteps`, one KV cache) or the vLLM backends
(`RemoteSteps`, one completion request per segment from the whole prefix). With R = mix_ratio (5, 15):

1. Prompt text and target text form one text stream. While prompt speech remains and >= R[0] text ids are
   buffered, [R[0] text, next <= R[1] prompt speech] blocks join the first input (after sos). Decoding starts
   once all prompt speech is placed; with no prompt speech the first input is [sos, R[0] text].
2. Speech tokens are generated (eos masked) until a fill token: sampled, or forced when len(out_tokens)
   reaches next_fill_index (first (P // R[1] + 1) * R[1] - P for P prompt speech tokens, then the fill's index
   + R[1] + 1). The fill is recorded in out_tokens (RAS history), never yielded or fed.
3. After a fill, the next piece that leaves >= R[0] text ids buffered feeds exactly one R[0]-id block.
4. When the text ends: [the block that produced the last fill (fed again, as the official does), the rest of
   the text, task_id] (before any decoding: the first input + rest of text + task_id; unplaced prompt speech
   is dropped), then decoding without the eos mask until eos. 6562 (and 6563 in the final decode) raise
   `BistreamError` (a 422 `cosy.errors.Unprocessable` that says what to do), as the official's ValueError.

CosyVoice3 (`ModelFamily.bistream_prefix_end`): the prompt text up to and including `<|endofprompt|>` (its system
prompt) joins the first input right after sos, unmixed; the rest of the prompt text starts the text stream.

The fed sequence is described by `Segment`s (kind + ids), so tests can compare every block with the official.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from cosy.errors import Unprocessable
from cosy.model.family import ModelFamily

KINDS = ("sos", "task_id", "prompt_text", "text", "prompt_speech", "speech")


class BistreamError(Unprocessable):
    """The LM produced a token the official bistream decoding rejects (its ValueError `should not get token
    N`, kept as `official`): the request's text and seed cannot be spoken duplex (422, the message says what to
    do instead). Seeded decoding repeats it; a whole-text request decodes otherwise and is not affected."""

    def __init__(self, token: int, where: str):
        self.token = token
        self.official = f"should not get token {token}"
        super().__init__(
            f"duplex synthesis failed: the model produced token {token} {where}, which text-in streaming "
            f"(bistream) decoding does not allow (the official CosyVoice stops there too: '{self.official}'); "
            "the audio sent before this error is incomplete. The same text, voice and seed fail the same way "
            "again: retry with another seed (or none), or send the text whole (not duplex: the HTTP APIs), "
            "which decodes each sentence without text streaming")


@dataclass(frozen=True)
class Segment:
    """Consecutive input positions of one kind: sos / task_id (no ids), prompt_text / text (text ids),
    prompt_speech / speech (speech ids). `refeed`: positions fed a second time (official quirk 4)."""

    kind: str
    ids: tuple[int, ...] = ()
    refeed: bool = False

    def __len__(self) -> int:
        return len(self.ids) if self.kind not in ("sos", "task_id") else 1


class StepBackend(Protocol):
    def run(self, block: Sequence[Segment], history: list[int], max_new: int, mask_eos: bool,
            stop: frozenset[int]) -> Iterator[int]:
        """Append `block` to the sequence, then generate up to `max_new` tokens, each one fed before the
        next is generated (the last one is not fed); stop after yielding a token in `stop`. `history`: the
        live out_tokens list (the caller appends every yielded token before asking for the next): the RAS
        window. `mask_eos`: eos (`tokens.min_len_mask`) is never drawn."""


def _text_segments(stream: list[tuple[str, int]]) -> list[Segment]:
    """[(kind, id), ...] (prompt_text / text ids in stream order) -> segments, one per run of a kind."""
    out: list[Segment] = []
    for kind, i in stream:
        if out and out[-1].kind == kind:
            out[-1] = Segment(kind, out[-1].ids + (i,))
        else:
            out.append(Segment(kind, (i,)))
    return out


def decode(pieces: Iterable[Sequence[int]], prompt_text: Sequence[int], prompt_speech: Sequence[int],
           backend: StepBackend, family: ModelFamily, max_final: int | None = None,
           out_tokens: list[int] | None = None) -> Iterator[int]:
    """Yield speech tokens as the text pieces arrive (`pieces` may block: a queue of streamed text).

    max_final: the most tokens of the final decode (the official has no limit; ours must; None: what the
    family's max length for the whole target text leaves after the speech tokens of the text phase).
    `out_tokens`: filled with the official out_tokens list (fills and the final eos included) for inspection."""
    n_text, n_speech = family.mix_ratio
    fill, eos = family.tokens.fill, family.tokens.eos
    out = out_tokens if out_tokens is not None else []
    prompt_text = [int(i) for i in prompt_text]
    end = family.bistream_prefix_end
    cut = prompt_text.index(end) + 1 if end is not None and end in prompt_text else 0
    text: list[tuple[str, int]] = [("prompt_text", i) for i in prompt_text[cut:]]  # buffered, not yet placed
    speech = [int(t) for t in prompt_speech]  # prompt speech not yet placed
    # the first input, built until decoding starts (CosyVoice3: the system prompt joins it unmixed)
    first: list[Segment] = [Segment("sos")] + ([Segment("prompt_text", tuple(prompt_text[:cut]))] if cut else [])
    started = False
    pending: list[Segment] = []  # positions the official fed but our backend has not seen yet
    last_block: list[Segment] = []  # what the forward that produced the last token was fed
    text_stop = frozenset(t for t in family.tokens.stop if t != eos)  # eos is masked in the text phase
    next_fill = (len(speech) // n_speech + 1) * n_speech - len(speech)

    def take() -> list[Segment]:
        nonlocal text
        block, text = _text_segments(text[:n_text]), text[n_text:]
        return block

    n_target = 0
    for piece in pieces:
        text += [("text", int(i)) for i in piece]
        n_target += len(piece)
        while speech and len(text) >= n_text:
            first += take() + [Segment("prompt_speech", tuple(speech[:n_speech]))]
            speech = speech[n_speech:]
        if speech:
            continue  # wait for more text before the next prompt speech block
        if started or len(first) == 1:  # after a fill, or no prompt speech yet: one text block is needed
            if len(text) < n_text:
                continue
            block = take() if started else first + take()
        else:
            block = first
        started = True
        sent = pending + block
        pending, last_block = [], block
        remaining = next_fill - len(out)
        produced = None
        for token in backend.run(sent, out, remaining, True, text_stop):
            if produced is not None:  # the forward that produced `token` was fed `produced`
                last_block = [Segment("speech", (produced,))]
            if token == fill:  # sampled fill: ends the segment early
                next_fill = len(out) + n_speech + 1
                out.append(token)
                break
            out.append(token)
            if token >= family.tokens.size:
                raise BistreamError(token, "(a stop token) while the text was still streaming in")
            produced = token
            yield token
        else:  # forced fill: the official fed `produced` (its forward's output is replaced by the fill)
            if produced is not None:
                last_block = pending = [Segment("speech", (produced,))]
            next_fill = len(out) + n_speech + 1
            out.append(fill)

    rest = _text_segments(text)
    if started:
        final = pending + [Segment(s.kind, s.ids, refeed=True) for s in last_block] + rest
    else:
        final = first + rest
    final.append(Segment("task_id"))
    stop = frozenset(family.tokens.stop)
    if max_final is None:
        max_final = max(family.length_limits(n_target)[1] - sum(t < family.tokens.size for t in out), 1)
    for token in backend.run(final, out, max_final, False, stop):
        out.append(token)
        if token == eos:
            return
        if token in stop or token >= family.tokens.size:
            what = "the text-streaming fill token" if token == fill else "a stop token other than the end"
            raise BistreamError(token, f"({what}) after the text's end")
        yield token


__all__ = ["BistreamError", "KINDS", "Segment", "StepBackend", "decode"]
