"""Hyperparameters of the speech-token LM: the Qwen2 backbone (`CosyVoice-BlankEN/config.json`) plus the
CosyVoice2 heads (`llm_input_size`, `speech_token_size` from `cosyvoice2.yaml`).

Defaults are the published CosyVoice2-0.5B values.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass
class LMConfig:
    hidden_size: int = 896
    num_hidden_layers: int = 24
    num_attention_heads: int = 14
    num_key_value_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 4864
    vocab_size: int = 151936  # rows of the text embedding table (the tokenizer has 151663 ids)
    rope_theta: float = 1e6
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    speech_token_size: int = 6561  # speech tokens 0..6560 (the family's `tokens.size`)
    speech_vocab: int = 6564  # + the family's special ids (CosyVoice2: eos 6561, 6562, fill 6563)

    @property
    def num_speech_rows(self) -> int:
        """Rows of `speech_embedding` / outputs of `llm_decoder`: the family's `tokens.vocab`."""
        return self.speech_vocab


def read_lm_config(qwen_config: str | Path, llm_input_size: int, speech_token_size: int,
                   speech_vocab: int) -> LMConfig:
    """Read the Qwen2 `config.json`; the yaml's `llm_input_size` must equal its hidden size.

    Raises ValueError naming the file for anything we don't implement (other architectures, rope scaling,
    sliding-window attention, an untied or non-SiLU model).
    """
    path = Path(qwen_config)
    try:
        c = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path} is not a readable JSON file ({type(e).__name__}: {e})") from None
    try:
        if c.get("model_type", "qwen2") != "qwen2":
            raise ValueError(f"model_type is {c['model_type']!r}, expected 'qwen2'")
        if c.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {c['hidden_act']!r} is not supported (only silu)")
        if c.get("rope_scaling") not in (None, {}):
            raise ValueError("rope_scaling is not supported")
        if c.get("use_sliding_window", False):
            raise ValueError("use_sliding_window is not supported")
        heads = int(c["num_attention_heads"])
        cfg = LMConfig(
            hidden_size=int(c["hidden_size"]),
            num_hidden_layers=int(c["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(c.get("num_key_value_heads", heads)),
            head_dim=int(c.get("head_dim") or int(c["hidden_size"]) // heads),
            intermediate_size=int(c["intermediate_size"]),
            vocab_size=int(c["vocab_size"]),
            rope_theta=float(c.get("rope_theta", 10000.0)),
            rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(c.get("max_position_embeddings", 32768)),
            speech_token_size=int(speech_token_size),
            speech_vocab=int(speech_vocab),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: {e}") from None
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ValueError(f"{path}: num_attention_heads must be a multiple of num_key_value_heads")
    if cfg.hidden_size != llm_input_size:
        raise ValueError(f"{path}: hidden_size {cfg.hidden_size} differs from the yaml's llm_input_size "
                         f"{llm_input_size}")
    return cfg
