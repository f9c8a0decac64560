"""HiFT vocoder: mel (B, 80, T) -> 24 kHz speech (B, T*480)."""
from cosy.hift.config import CausalHiFTConfig, HiFTConfig
from cosy.hift.generator import HiFTGenerator
from cosy.hift.weights import (
    fold_weight_norm,
    to_legacy_names,
    to_parametrization_names,
    unfold_weight_norm,
    weight_normed_keys,
)

__all__ = [
    "CausalHiFTConfig",
    "HiFTConfig",
    "HiFTGenerator",
    "fold_weight_norm",
    "to_legacy_names",
    "to_parametrization_names",
    "unfold_weight_norm",
    "weight_normed_keys",
]
