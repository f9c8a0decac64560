"""A random-weight llm.pt with exactly the official keys of the family's LM: CosyVoice2 `Qwen2LM` (text vocab
151936, `llm_embedding`, 6564 speech rows, head with bias) or CosyVoice3 `CosyVoice3LM` (no `llm_embedding`,
6761 speech rows, head without bias).

Like the published file, `llm.model.lm_head.weight` is the tied `embed_tokens` tensor, so `torch.save`
stores it once. The init aims at a model whose numbers look like a trained one's in the ways our tests
need, at any width:
  * backbone linears N(0, s^2) with s = 0.1 * sqrt(64 / hidden): at hidden 64 this is the golden fixtures'
    initializer_range 0.1 (attention visibly non-flat); wider models get the same per-layer statistics
    (attention-logit spread ~0.6), where a fixed 0.1 would make 896-wide layers saturate.
  * q/k/v biases and RMSNorm gains are non-trivial (N(0, 0.5^2), 1 + N(0, 0.1^2)), so a loader or engine
    that drops a bias or a gain gives visibly different logits.
  * llm_decoder makes logits with spread ~2.5 (a few tokens hold most of the mass, the 25-token nucleus
    is usually the top-p cut), not the nearly flat softmax of a default init.
  * embedding tables N(0, 1) (torch's nn.Embedding default), so text and speech prompt rows match in scale.
Seeded with a private torch.Generator: the same arguments give the same file; the caller's RNG is untouched.
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from cosy.lm.prompt import tables_of
from cosy.model.families.cosyvoice2 import FAMILY
from cosy.model.family import ModelFamily

TEXT_VOCAB = 151936
SPEECH_ROWS = FAMILY.tokens.vocab  # CosyVoice2: 6561 speech tokens + eos, 6562, fill
QKV_BIAS_STD = 0.5
NORM_GAIN_STD = 0.1
LOGIT_STD = 2.5
DECODER_BIAS_STD = 0.5


def llm_state_dict(hidden: int, n_layers: int, n_heads: int, n_kv_heads: int, intermediate: int,
                   seed: int, family: ModelFamily = FAMILY) -> dict[str, torch.Tensor]:
    """The random state dict in llm.pt's key order (lm_head is the embed_tokens tensor itself)."""
    if hidden % n_heads or n_heads % n_kv_heads:
        raise ValueError("hidden must be a multiple of n_heads, and n_heads a multiple of n_kv_heads")
    g = torch.Generator().manual_seed(seed)
    kv = hidden // n_heads * n_kv_heads
    s = 0.1 * math.sqrt(64 / hidden)

    def normal(*shape: int, std: float = 1.0, mean: float = 0.0) -> torch.Tensor:
        return torch.randn(*shape, generator=g).mul_(std).add_(mean)

    embed = normal(TEXT_VOCAB, hidden)
    sd = {"llm_embedding.weight": normal(2, hidden)} if "llm_embedding" in tables_of(family) else {}
    sd["llm.model.model.embed_tokens.weight"] = embed
    for i in range(n_layers):
        p = f"llm.model.model.layers.{i}."
        sd.update({
            p + "self_attn.q_proj.weight": normal(hidden, hidden, std=s),
            p + "self_attn.q_proj.bias": normal(hidden, std=QKV_BIAS_STD),
            p + "self_attn.k_proj.weight": normal(kv, hidden, std=s),
            p + "self_attn.k_proj.bias": normal(kv, std=QKV_BIAS_STD),
            p + "self_attn.v_proj.weight": normal(kv, hidden, std=s),
            p + "self_attn.v_proj.bias": normal(kv, std=QKV_BIAS_STD),
            p + "self_attn.o_proj.weight": normal(hidden, hidden, std=s),
            p + "mlp.gate_proj.weight": normal(intermediate, hidden, std=s),
            p + "mlp.up_proj.weight": normal(intermediate, hidden, std=s),
            p + "mlp.down_proj.weight": normal(hidden, intermediate, std=s),
            p + "input_layernorm.weight": normal(hidden, std=NORM_GAIN_STD, mean=1.0),
            p + "post_attention_layernorm.weight": normal(hidden, std=NORM_GAIN_STD, mean=1.0),
        })
    rows = family.tokens.vocab
    sd.update({
        "llm.model.model.norm.weight": normal(hidden, std=NORM_GAIN_STD, mean=1.0),
        "llm.model.lm_head.weight": embed,  # tied, as in the published file
        "llm_decoder.weight": normal(rows, hidden, std=LOGIT_STD / math.sqrt(hidden)),
    })
    if family.lm_head_bias:
        sd["llm_decoder.bias"] = normal(rows, std=DECODER_BIAS_STD)
    sd["speech_embedding.weight"] = normal(rows, hidden)
    return sd


def write_llm_pt(path: Path, hidden: int, n_layers: int, n_heads: int, n_kv_heads: int, intermediate: int,
                 seed: int, family: ModelFamily = FAMILY) -> None:
    """Write the random llm.pt (atomically). Tiny: 64, 2, 2, 1, 128. Full: 896, 24, 14, 2, 4864 (~2 GB)."""
    path = Path(path)
    sd = llm_state_dict(hidden, n_layers, n_heads, n_kv_heads, intermediate, seed, family)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(sd, tmp)
    os.replace(tmp, path)
