"""What distinguishes one CosyVoice model family from another, as data every layer asks instead of constants.

A model directory is read into one `ModelFamily` (`ModelDir.family`, detected by the yaml file name as the
official `AutoModel` does: cosyvoice2.yaml -> CosyVoice2, cosyvoice3.yaml -> CosyVoice3). The families
themselves are defined one per module in `cosy.model.families`.

Classes are named by "module:attribute" strings (like Hugging Face's `auto_map`), resolved with
`import_object` when a layer builds them: a family module stays free of torch/vLLM imports, and
`cosy.model.files` can import the registry without an import cycle.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class ModelFiles:
    """File names inside a model directory (the official layout of the family)."""

    yaml: str  # identifies the family: the official loader decides by this name
    speech_tokenizer: str  # ONNX, 16 kHz Whisper log-mel (1, 128, F) -> speech tokens (1, ceil(F / 4))
    llm: str = "llm.pt"
    # other LM checkpoints of the same format shipped beside llm.pt, by variant name (`--llm_variant`)
    llm_variants: tuple[tuple[str, str], ...] = ()
    flow: str = "flow.pt"
    hift: str = "hift.pt"
    campplus: str = "campplus.onnx"
    qwen_dir: str = "CosyVoice-BlankEN"  # Qwen2 config.json + BPE tokenizer of the LM backbone

    @property
    def all(self) -> tuple[str, ...]:
        """Every file a complete directory holds, the yaml first."""
        return (self.yaml, self.llm, self.flow, self.hift, self.campplus, self.speech_tokenizer, self.qwen_dir)

    def llm_file(self, variant: str | None = None) -> str:
        """The LM checkpoint of `variant` (None or "default": llm.pt); ValueError naming the known ones."""
        if variant in (None, "", "default"):
            return self.llm
        known = dict(self.llm_variants)
        if variant not in known:
            raise ValueError(f"unknown LM variant {variant!r} (this model family has: "
                             f"{', '.join(('default', *known))})")
        return known[variant]


@dataclass(frozen=True)
class SpeechTokens:
    """Ids of the speech-token LM's output vocabulary.

    CosyVoice2: speech tokens 0..6560, then eos 6561, 6562 (also stops), fill 6563: vocab 6564.
    CosyVoice3: speech tokens 0..6560, sos 6561, eos 6562, task_id 6563, fill 6564, 6565..6760 unused: vocab
    6761, every id >= 6561 stops.
    """

    size: int  # speech tokens 0..size-1: what the speech tokenizer emits and the flow embeds
    vocab: int  # rows of speech_embedding / outputs of llm_decoder (the LM head): size + special ids
    eos: int
    stop: tuple[int, ...]  # any of these ends decoding (never yielded)
    fill: int
    min_len_mask: int  # the id masked while fewer than min_len tokens were produced (official: 6561 in both)
    # tokens the model counts as silence: after `max_silent_run` of them in a row, further ones are dropped
    # from the output (the LM itself still saw them). CosyVoice2: none.
    silent: tuple[int, ...] = ()
    max_silent_run: int = 5

    def __post_init__(self):
        if not (self.size <= min(self.stop) and max(self.stop) < self.vocab and self.eos in self.stop):
            raise ValueError(f"inconsistent speech token ids: {self}")
        if any(not 0 <= t < self.size for t in self.silent):
            raise ValueError(f"silent tokens must be speech tokens (< {self.size}): {self.silent}")


@dataclass(frozen=True)
class EmbeddingRow:
    """One row of an llm.pt embedding table: `table` is 'llm_embedding' or 'speech_embedding'."""

    table: str
    row: int


@dataclass(frozen=True)
class ModelFamily:
    """One model family: file names, token ids, prompt format and the classes that implement it.

    Frozen and hashable; compare families by identity or `name`.
    """

    name: str  # "cosyvoice2"; also written into the exported vLLM config.json (`cosy_family`)
    display_name: str  # "CosyVoice2": how pages and logs name the family
    files: ModelFiles
    tokens: SpeechTokens
    # the LM prompt is [sos, embed_tokens(prompt_text ++ text), task_id, speech_embedding(prompt_speech)]
    sos: EmbeddingRow
    task_id: EmbeddingRow
    # official yaml class names we read arguments of (last dotted component), by yaml path
    yaml_classes: tuple[tuple[str, str], ...]
    # vLLM export (cosy.lm.export) and plugin (cosy.vllm_plugin)
    vllm_architecture: str  # `architectures` of the exported config.json
    vllm_model: str  # "module:Class" registered with vLLM under vllm_architecture
    served_name_prefix: str  # served model name (and export dir): <prefix>-<llm.pt sha256>
    export_weights: tuple[tuple[str, str], ...]  # (exported key, llm.pt key) besides the backbone layers
    backbone_prefix: str = "llm.model.model."  # llm.pt keys of the Qwen2 layers and final norm
    lm_head_bias: bool = True  # llm_decoder has a bias (CosyVoice2) or not (CosyVoice3)
    # text tokenizer: the specials appended after the Qwen2 base ones, in the official order
    text_specials: str = "cosy.text.specials:COSYVOICE2"
    # prompt text format
    end_of_prompt: str = "<|endofprompt|>"  # ends an instruction (appended when missing, unless required)
    # CosyVoice3: "You are a helpful assistant.<|endofprompt|>", which leads the zero-shot prompt text and the
    # cross-lingual text (text with <|...|> is neither normalized nor split, as officially)
    system_prompt: str = ""
    # True: an instruction must already end in `end_of_prompt` (CosyVoice3's instruct2 takes the whole LM
    # prompt from the caller); False: the marker is appended when missing (CosyVoice2)
    instruct_requires_end: bool = False
    instruct_example: str = "用粤语说这句话"  # shown in the error for a bad instruction
    # the tokenizer has phoneme tokens ([ch][óng], [AH0]: CosyVoice3), which SSML's <phoneme> is written into
    phoneme_tags: bool = False
    # valid instructions the WebUI offers (the first is its placeholder)
    instruct_examples: tuple[str, ...] = ("用四川话说这句话", "用粤语说这句话", "用开心的语气说", "用伤心的语气说",
                                          "Speak slowly and softly.", "Speak with great excitement!")
    prompt_mel_fmax: float | None = 8000.0  # top of the flow prompt mel's filter bank (CosyVoice3: None = sr/2)
    # output length per target text token: [min_ratio * n, max_ratio * n]
    min_token_text_ratio: float = 2
    max_token_text_ratio: float = 20
    token_frame_rate: int = 25  # speech tokens per second of audio
    # text-in streaming ("bistream", cosy.lm.bistream): text tokens, then speech tokens, per block
    mix_ratio: tuple[int, int] = (5, 15)
    # bistream: prompt text up to and including this id goes into the first input unmixed (CosyVoice3:
    # <|endofprompt|>, ending the system prompt); None: all prompt text is mixed with the prompt speech
    bistream_prefix_end: int | None = None
    # implementations, "module:attribute"
    lm: str = "cosy.lm.model:SpeechLM"
    flow: str = "cosy.flow.model:FlowModel"
    flow_estimator: str = "cosy.flow.decoder:CausalConditionalDecoder"
    hift: str = "cosy.hift.generator:HiFTGenerator"
    # streaming vocoder semantics (cosy.pipeline.stream_vocoder): CosyVoice2 crossfades chunks;
    # CosyVoice3: "cosy.pipeline.stream_vocoder:CausalStreamVocoder" (the official re-vocoding of the whole
    # mel, computed on the new frames and their context only)
    stream_vocoder: str = "cosy.pipeline.stream_vocoder:CrossfadeVocoder"
    # golden-case handler lists ("module:attribute") for `cosy.golden_check`; absent modules are skipped
    golden_handlers: tuple[str, ...] = ("cosy.verify.golden_cases:HANDLERS", "cosy.verify.golden_bistream:HANDLERS")

    @property
    def expected_classes(self) -> dict[str, str]:
        return dict(self.yaml_classes)

    def length_limits(self, n_text_tokens: int) -> tuple[int, int]:
        """(min_len, max_len) of the output for a target text of n tokens (prompt text not counted)."""
        return int(self.min_token_text_ratio * n_text_tokens), int(self.max_token_text_ratio * n_text_tokens)

    def instruct_prompt(self, instruct: str) -> str:
        """The instruction as the LM's prompt text: ends in `end_of_prompt` (appended when it does not, unless
        the family requires it: ValueError saying what to write)."""
        if instruct.endswith(self.end_of_prompt):
            return instruct
        if self.instruct_requires_end:
            raise ValueError(f"a {self.name} instruction is the LM's whole prompt and ends in {self.end_of_prompt}, "
                             f"e.g. {self.instruct_example!r}")
        return instruct + self.end_of_prompt

    def served_model_name(self, fingerprint: str) -> str:
        """What a backend serves llm.pt (sha256 hex `fingerprint`) as; frontends compare it with /v1/models."""
        return f"{self.served_name_prefix}-{fingerprint[:16]}"


def import_object(spec: str):
    """'package.module:attribute' -> the attribute."""
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


__all__ = ["EmbeddingRow", "ModelFamily", "ModelFiles", "SpeechTokens", "import_object"]
