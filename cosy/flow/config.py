"""Hyperparameters of the flow stage (speech tokens -> mel). Defaults are the official CosyVoice2 sizes."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class EncoderConfig:
    """UpsampleConformerEncoder."""

    # width of the token embedding and of the whole encoder (official hard-codes 512 in pre-lookahead/upsample)
    input_size: int = 512
    output_size: int = 512
    attention_heads: int = 8
    linear_units: int = 2048
    num_blocks: int = 6
    num_up_blocks: int = 4  # hard-coded 4 in official
    static_chunk_size: int = 25  # streaming chunk, tokens (before upsampling)
    pre_lookahead_len: int = 3
    upsample_stride: int = 2  # = token_mel_ratio


@dataclass
class EstimatorConfig:
    """CausalConditionalDecoder (the U-Net-like velocity estimator of the CFM)."""

    in_channels: int = 320
    out_channels: int = 80
    channels: tuple[int, ...] = (256,)
    attention_head_dim: int = 64
    n_blocks: int = 4
    num_mid_blocks: int = 12
    num_heads: int = 8
    static_chunk_size: int = 50  # mel frames
    num_decoding_left_chunks: int = -1


@dataclass
class CFMConfig:
    """CausalConditionalCFM sampling."""

    n_timesteps: int = 10
    inference_cfg_rate: float = 0.7
    t_scheduler: str = "cosine"
    noise_seed: int = 0
    noise_frames: int = 15000


@dataclass
class FlowConfig:
    """CausalMaskedDiffWithXvec."""

    vocab_size: int = 6561
    input_size: int = 512
    output_size: int = 80  # mel bins
    spk_embed_dim: int = 192
    token_mel_ratio: int = 2
    pre_lookahead_len: int = 3
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    estimator: EstimatorConfig = field(default_factory=EstimatorConfig)
    cfm: CFMConfig = field(default_factory=CFMConfig)
