"""What the LM is given per mode (the official frontends' rules, per model family): the prompt text ids, the
prompt speech tokens and the text segments (each one LM call).

| mode | prompt text | text | prompt speech |
| --- | --- | --- | --- |
| zero_shot / voice | system prompt + transcript (normalized unless it holds <|...|>) | normalized segments | yes |
| cross_lingual | none | system prompt + text (with a system prompt: one segment, not normalized) | none |
| instruct | the instruction as the family wants it (`ModelFamily.instruct_prompt`) | normalized segments | none |

The system prompt is the family's (`ModelFamily.system_prompt`: CosyVoice3's
"You are a helpful assistant.<|endofprompt|>", empty for CosyVoice2). Text holding `<|` and `|>` is neither
normalized nor split (`TextFrontend.normalize`), which is why a CosyVoice3 prompt transcript is taken as typed.
"""
from __future__ import annotations

from dataclasses import dataclass

from cosy.model.family import ModelFamily
from cosy.pipeline.request import SynthesisError
from cosy.text.frontend import TextFrontend
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


__all__ = ["LMInput", "lm_input", "lm_prompt", "segments"]
