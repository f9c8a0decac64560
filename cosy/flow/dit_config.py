"""Hyperparameters of CosyVoice3's flow stage (official `CausalMaskedDiffWithDiT` + `DiT`).

Defaults are the published Fun-CosyVoice3-0.5B sizes; `cosy.model.config` fills them from cosyvoice3.yaml.
The CFM sampler is CosyVoice2's (`cosy.flow.config.CFMConfig`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from cosy.flow.config import CFMConfig


@dataclass
class DiTConfig:
    """The DiT velocity estimator (`flow.decoder.estimator`)."""

    dim: int = 1024
    depth: int = 22
    heads: int = 16
    dim_head: int = 64
    ff_mult: int = 2
    mel_dim: int = 80
    mu_dim: int = 80
    spk_dim: int = 80
    out_channels: int = 80
    static_chunk_size: int = 50  # mel frames per attention block when streaming
    num_decoding_left_chunks: int = -1  # blocks to the left a frame may see (< 0: all)
    time_embed_dim: int = 256  # sinusoid width of the flow time (official default, not in the yaml)
    conv_pos_kernel: int = 31  # causal conv position embedding (official defaults)
    conv_pos_groups: int = 16


@dataclass
class DiTFlowConfig:
    """CausalMaskedDiffWithDiT: token embedding, pre-lookahead layer, CFM with a DiT estimator."""

    vocab_size: int = 6561
    input_size: int = 80  # token embedding width (= mel bins: no encoder)
    output_size: int = 80  # mel bins
    spk_embed_dim: int = 192
    token_mel_ratio: int = 2
    pre_lookahead_len: int = 3
    pre_lookahead_channels: int = 1024
    estimator: DiTConfig = field(default_factory=DiTConfig)
    cfm: CFMConfig = field(default_factory=CFMConfig)
