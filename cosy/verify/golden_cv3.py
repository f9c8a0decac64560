"""Golden-case handlers of the CosyVoice3 format (`shared/reference/golden-cv3`): audio, text and LM cases.

`HANDLERS` is one of the lists the CosyVoice3 family names (`ModelFamily.golden_handlers`); the flow, HiFT and
token2wav cases live in `cosy.verify.golden_cv3_speech`. Same contract as `cosy.verify.golden_cases`: a
handler returns our value per output (tensors, literals) and `(ours, official)` pairs for results kept in
`extra`. What differs from CosyVoice2's handlers: the prompt mel's fmax is the family's (None), the literal
outputs (`len`, `min_len`, `max_len`) are compared as literals, and the frontend modes run our own LM-input
rules (`cosy.pipeline.lm_input`) on the official calls' arguments.
"""
from __future__ import annotations

from typing import Any

from cosy.audio.features import flow_mel
from cosy.pipeline.lm_input import lm_input
from cosy.verify.golden_cases import GoldenModels, _wav, alignment_case, text_normalize_case

# official CosyVoice3 entry points -> our API modes (instruct maps to instruct2)
MODES = {"inference_zero_shot": "zero_shot", "inference_cross_lingual": "cross_lingual",
         "inference_instruct2": "instruct"}


def _prompt_mel(g: GoldenModels, case: dict):
    return flow_mel(_wav(g, case, 24000), g.family.prompt_mel_fmax)


def flow_mel_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    mel = _prompt_mel(g, case)
    return {"speech_feat": mel, "speech_feat_len": mel.shape[1]}


def tokenizer_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    tok = g.text.tokenizer
    items = g.extra["tokenizer"]
    out: dict[str, Any] = {f"encode[{i}]": (tok.encode(e["text"]), e["ids"]) for i, e in enumerate(items["encode"])}
    for i, e in enumerate(items.get("decode_skip_special", [])):
        out[f"decode[{i}]"] = (tok.decode(e["ids"], skip_special_tokens=True), e["text"])
    out["special_token_ids"] = ({t: tok.token_id(t) for t in items["special_token_ids"]}, items["special_token_ids"])
    out["len"] = len(tok)
    return out


def frontend_modes_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    """Each official call's arguments through our API: the system prompt the official caller typed is taken
    off again (our API adds it), then the LM inputs must equal what the official `model.tts` received."""
    system, out = g.family.system_prompt, {}
    for m in g.extra["frontend_modes"]:
        kw, mode = m["kwargs"], MODES[m["call"].rsplit(".", 1)[-1]]
        tts_text, prompt_text = kw["tts_text"], kw.get("prompt_text", "")
        if mode == "zero_shot":
            assert prompt_text.startswith(system), prompt_text
            prompt_text = prompt_text[len(system):]
        elif mode == "cross_lingual":
            assert tts_text.startswith(system), tts_text
            tts_text = tts_text[len(system):]
        calls = m["tts_calls"]
        n_prompt = calls[0].get("llm_prompt_speech_token_len", 0)
        ours = lm_input(g.text, g.family, mode, tts_text, prompt_text, kw.get("instruct_text", ""),
                        list(range(n_prompt)))
        label = f"[{m['mode']}]"
        out[label + ".segments"] = ([ids for _, ids in ours.segments], [c["text"] for c in calls])
        out[label + ".prompt_text"] = (ours.prompt_text, calls[0].get("prompt_text", []))
        out[label + ".prompt_speech_len"] = (len(ours.prompt_speech), n_prompt)
    return out


def lm_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    inp = case["inputs"]

    def ids(name: str) -> list[int]:
        spec = inp.get(name)
        return g.tensor(spec).flatten().tolist() if isinstance(spec, dict) else []

    text = ids("text")
    embeds = g.lm.prompt_embeds(text, ids("prompt_text"), ids("prompt_speech_token"))
    logp, hidden = g.lm.teacher_forced_logprobs(embeds, g.tensor(inp["continuation"]).flatten().tolist())
    min_len, max_len = g.family.length_limits(len(text))
    return {"lm_input": embeds, "logp": logp, "last_hidden": hidden, "min_len": min_len, "max_len": max_len}


# (test on the case's `producer`, handler); the first match wins. Each test accepts only CosyVoice3 producers
# (so the list is also safe where every golden module's handlers are tried, CosyVoice2 cases included), and
# none a flow, HiFT or token2wav one (CausalMaskedDiffWithDiT..., CausalHiFTGenerator..., CosyVoice3Model.tts).
HANDLERS = [
    (lambda p: p.startswith("CosyVoiceFrontEnd._extract_speech_feat (cosyvoice3.yaml"), flow_mel_case),
    # the token/mel alignment is CosyVoice2's rule, and the mel length does not depend on fmax
    (lambda p: p.startswith("CosyVoiceFrontEnd.frontend_") and "resample_rate" in p, alignment_case),
    (lambda p: p.startswith("CosyVoice3Tokenizer.encode"), tokenizer_case),
    (lambda p: p.startswith("CosyVoice3.inference_zero_shot"), frontend_modes_case),
    (lambda p: "text_normalize" in p and "CosyVoice3 tokenizer" in p, text_normalize_case),
    (lambda p: p.startswith("CosyVoice3LM.inference ("), lm_case),  # not inference_bistream
]
