"""Hyperparameters of the HiFT vocoder (official `HiFTGenerator` + `ConvRNNF0Predictor`).

Defaults are the published CosyVoice2 full-size values; `cosy.model.config` fills them from the yaml.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class HiFTConfig:
    in_channels: int = 80
    base_channels: int = 512
    nb_harmonics: int = 8
    sampling_rate: int = 24000
    nsf_alpha: float = 0.1
    nsf_sigma: float = 0.003
    nsf_voiced_threshold: float = 10.0
    upsample_rates: tuple[int, ...] = (8, 5, 3)
    upsample_kernel_sizes: tuple[int, ...] = (16, 11, 7)
    istft_n_fft: int = 16
    istft_hop_len: int = 4
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    source_resblock_kernel_sizes: tuple[int, ...] = (7, 7, 11)
    source_resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    lrelu_slope: float = 0.1
    audio_limit: float = 0.99
    f0_num_class: int = 1
    f0_in_channels: int = 80
    f0_cond_channels: int = 512

    @property
    def upsample_scale(self) -> int:
        """Output samples per mel frame (8 * 5 * 3 * 4 = 480 for CosyVoice2)."""
        return math.prod(self.upsample_rates) * self.istft_hop_len

    @property
    def stft_channels(self) -> int:
        """Real + imaginary bins of the source STFT (n_fft + 2 = 18)."""
        return self.istft_n_fft + 2


@dataclass
class CausalHiFTConfig(HiFTConfig):
    """CosyVoice3's `CausalHiFTGenerator` (+ `CausalConvRNNF0Predictor`); defaults: Fun-CosyVoice3-0.5B.

    The flow_* sizes are not HiFT's: they are what the official yaml builds from the torch RNG between the
    CFM's reseed and the HiFT source (the flow's token embedding and speaker projection), which fixes the
    source's noise tables (see `cosy.hift.noise_tables`).
    """

    conv_pre_look_right: int = 4  # mel frames of right context of conv_pre (kernel conv_pre_look_right + 1)
    f0_look_right: int = 3  # of the f0 predictor's first conv (kernel 4); official hard-coded
    flow_vocab_size: int = 6561
    flow_input_size: int = 80
    flow_spk_embed_dim: int = 192
    flow_output_size: int = 80
    cfm_noise_frames: int = 15000  # the CFM's seed-0 noise (1, 80, frames), drawn right after the reseed
    max_seconds: int = 300  # length of the official noise tables: one call's cap
