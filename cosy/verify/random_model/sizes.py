"""The dimensions of the two random model sizes: `full` (the published model) and `tiny` (fast CPU tests)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Size:
    llm_size: int  # Qwen2 hidden size
    llm_layers: int
    llm_heads: int
    llm_kv_heads: int
    llm_intermediate: int
    enc_heads: int
    enc_units: int
    enc_blocks: int
    est_channels: int
    est_head_dim: int
    est_blocks: int
    est_mid_blocks: int
    est_heads: int
    hift_channels: int


SIZES = {
    # CosyVoice2-0.5B as published.
    "full": Size(llm_size=896, llm_layers=24, llm_heads=14, llm_kv_heads=2, llm_intermediate=4864,
                 enc_heads=8, enc_units=2048, enc_blocks=6, est_channels=256, est_head_dim=64,
                 est_blocks=4, est_mid_blocks=12, est_heads=8, hift_channels=512),
    # The golden fixtures' dimensions. The flow encoder keeps its 512 width and 4 up-blocks because the
    # official code hard-codes them; the LM hidden size gives head dim 32 (vLLM-CPU needs >= 32).
    "tiny": Size(llm_size=64, llm_layers=2, llm_heads=2, llm_kv_heads=1, llm_intermediate=128,
                 enc_heads=2, enc_units=128, enc_blocks=2, est_channels=64, est_head_dim=32,
                 est_blocks=1, est_mid_blocks=2, est_heads=2, hift_channels=64),
}
