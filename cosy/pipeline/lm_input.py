"""What the LM is given per mode (the official frontends' rules, per model family): the prompt text ids, the
prompt speech tokens and the text segments (each one LM call).

| mode | prompt text | text | prompt speech |
| --- | --- | --- | --- |
| zero_shot / voice | system prompt + transcript (normalized unless it holds <|...|>) | normalized segments | yes |
| cross_lingual | none | system prompt + text (with a system prompt: one segment, not normalized) | none |
| instruct | the instruction as the family wants it (`ModelFamily.instruct_prompt`) | normalized segments | none |

A segment the LM cannot take in one call (its prompt, its text and the longest speech the family allows for
it, `ModelFamily.length_limits`, over the LM's context) is cut to fit (`fit_context`); segments that fit stay
the official ones.

The system prompt is the family's (`ModelFamily.system_prompt`: CosyVoice3's
"You are a helpful assistant.<|endofprompt|>", empty for CosyVoice2). Text holding `<|` and `|>` is neither
normalized nor split (`TextFrontend.normalize`), which is why a CosyVoice3 prompt transcript is taken as typed.
"""
from __future__ import annotations

from dataclasses import dataclass

from cosy.model.family import ModelFamily
from cosy.pipeline.request import LM_FIXED_TOKENS, SynthesisError
from cosy.text.frontend import TextFrontend
from cosy.text.split import NoSplit, is_only_punctuation
from cosy.text.tokenizer import ENDOFPROMPT_ID


@dataclass
class LMInput:
    prompt_text: list[int]  # token ids before the text (the LM's prompt_text)
    prompt_speech: list[int]  # speech tokens the LM continues from
    segments: list[tuple[str, list[int]]]  # (text, token ids) per LM call


def lm_input(text: TextFrontend, family: ModelFamily, mode: str, tts_text: str, prompt_text: str = "",
             instruct_text: str = "", speech_tokens: list[int] | None = None) -> LMInput:
    """The LM's inputs for one request; SynthesisError naming what is missing or malformed."""
    ids, speech = lm_prompt(text, family, mode, prompt_text, instruct_text, speech_tokens)
    if mode == "cross_lingual" and family.system_prompt and tts_text.strip():
        tts_text = family.system_prompt + tts_text  # CosyVoice3: before the text, which is then one segment
    return LMInput(ids, speech, segments(text, tts_text))


def lm_prompt(text: TextFrontend, family: ModelFamily, mode: str, prompt_text: str = "", instruct_text: str = "",
              speech_tokens: list[int] | None = None) -> tuple[list[int], list[int]]:
    """(prompt text ids, prompt speech tokens) the LM continues from in `mode`, whatever the text to speak
    (the duplex path streams that text in later); SynthesisError naming what is missing or malformed."""
    if mode in ("zero_shot", "voice"):
        if not prompt_text.strip():
            raise SynthesisError(f"mode '{mode}' needs the prompt's transcript (prompt_text)")
        ids = text.encode(text.normalize(family.system_prompt + prompt_text, split=False)[0])
        return ids, list(speech_tokens or [])
    if mode == "instruct":
        instruct = instruct_text.strip()
        if not instruct:
            raise SynthesisError("mode 'instruct' needs an instruction (instruct_text)")
        try:
            ids = text.encode(family.instruct_prompt(instruct))
        except ValueError as e:
            raise SynthesisError(str(e)) from None
        assert ids[-1] == ENDOFPROMPT_ID
        return ids, []  # the instruction is not normalized, and no prompt speech
    if mode == "cross_lingual":
        return [], []
    raise SynthesisError(f"mode '{mode}' does not run the LM")


def segments(text: TextFrontend, tts_text: str) -> list[tuple[str, list[int]]]:
    """The text's normalized segments and their ids; SynthesisError when nothing is left to speak."""
    if not tts_text or not tts_text.strip():
        raise SynthesisError("text is empty")
    out = [(s, ids) for s, ids in text.segments(tts_text) if ids]
    if not out:
        raise SynthesisError("text has nothing to speak (only punctuation or symbols)")
    return out


def text_room(family: ModelFamily, available: int) -> int:
    """The most text ids one LM call can hold in `available` positions: n ids take n + the longest speech
    the family allows for them (`length_limits(n)[1]`, 20 per id officially). 0 when not even one fits."""
    n = max(0, int(available // (1 + family.max_token_text_ratio)))
    while n + 1 + family.length_limits(n + 1)[1] <= available:
        n += 1
    while n > 0 and n + family.length_limits(n)[1] > available:
        n -= 1
    return n


def fit_context(text: TextFrontend, family: ModelFamily, inputs: LMInput, context: int | None) -> LMInput:
    """`inputs` with every segment that does not fit one LM call of `context` tokens (the backend's
    max_model_len: prompt and output) cut to fit (`TextFrontend.fit`), so that no call is refused; unchanged
    when every segment fits or the context is unknown (None). SynthesisError (400) when the prompt leaves no
    room, or a piece that cannot be cut does not fit: what is asked can never be spoken, before any audio."""
    if not context:
        return inputs
    prompt = LM_FIXED_TOKENS + len(inputs.prompt_text) + len(inputs.prompt_speech)
    room = text_room(family, context - prompt)
    if all(len(ids) <= room for _, ids in inputs.segments):
        return inputs
    beside = (f"the voice prompt ({len(inputs.prompt_text)} text tokens of prompt_text or instruct_text, "
              f"{len(inputs.prompt_speech)} speech tokens of the prompt audio)")
    if room < 1:
        raise SynthesisError(f"the LM has no room for text beside {beside}: one LM call holds at most {context} "
                             "tokens (its max_model_len), prompt and speech included; use a shorter prompt_text "
                             "or prompt audio")
    out = []
    for segment, ids in inputs.segments:
        if len(ids) <= room:
            out.append((segment, ids))
            continue
        try:
            pieces = text.fit(segment, room)
        except NoSplit as e:
            raise SynthesisError(f"the text cannot be cut to fit the LM: {e.unit[:40]!r} alone is {e.tokens} text "
                                 f"tokens, but beside {beside} one LM call has room for {room} (it holds at most "
                                 f"{context} tokens, its max_model_len, with the speech of the text); use a "
                                 "shorter prompt_text or prompt audio") from None
        out += [(p, ids) for p in pieces if not is_only_punctuation(p.strip()) and (ids := text.encode(p))]
    return LMInput(inputs.prompt_text, inputs.prompt_speech, out)


__all__ = ["LMInput", "fit_context", "lm_input", "lm_prompt", "segments", "text_room"]
