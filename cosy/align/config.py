"""Hyperparameters of the forced aligner's wav2vec2 CTC model, read from its Hugging Face `config.json`.

Defaults are the published MMS-300m forced aligner's (`MahmoudAshraf/mms-300m-1130-forced-aligner`, the
model the `ctc-forced-aligner` package loads): wav2vec2 with layer-normed conv features and the "stable"
(pre-norm) transformer, 24 layers of width 1024, 31 CTC outputs. Only what inference needs is read; a
config this code does not implement is refused with the field named.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

_DEFAULT_CONV = (512,) * 7


@dataclass(frozen=True)
class AlignerConfig:
    conv_dim: tuple[int, ...] = _DEFAULT_CONV  # channels of each feature-encoder conv
    conv_kernel: tuple[int, ...] = (10, 3, 3, 3, 3, 2, 2)
    conv_stride: tuple[int, ...] = (5, 2, 2, 2, 2, 2, 2)  # product 320: one frame per 20 ms at 16 kHz
    conv_bias: bool = True
    feat_extract_norm: str = "layer"  # "layer": LayerNorm after every conv; "group": GroupNorm after the first
    hidden_size: int = 1024
    num_hidden_layers: int = 24
    num_attention_heads: int = 16
    intermediate_size: int = 4096
    num_conv_pos_embeddings: int = 128  # the positional conv's kernel
    num_conv_pos_embedding_groups: int = 16
    layer_norm_eps: float = 1e-5
    do_stable_layer_norm: bool = True  # pre-norm layers and a final encoder LayerNorm (else post-norm)
    vocab_size: int = 31  # CTC outputs (lm_head rows)
    sampling_rate: int = 16000  # the audio the model was trained on (feature extractor's rate)

    @property
    def frame_samples(self) -> int:
        """Input samples per output frame (the conv strides' product)."""
        out = 1
        for s in self.conv_stride:
            out *= s
        return out

    def num_frames(self, num_samples: int) -> int:
        """Output frames for `num_samples` input samples (each conv: floor((n - kernel) / stride) + 1)."""
        n = num_samples
        for k, s in zip(self.conv_kernel, self.conv_stride):
            n = (n - k) // s + 1
            if n < 1:
                return 0
        return n

    def to_json(self) -> dict:
        """The fields as the published config.json spells them (what our builder writes)."""
        return {
            "architectures": ["Wav2Vec2ForCTC"], "model_type": "wav2vec2",
            "conv_dim": list(self.conv_dim), "conv_kernel": list(self.conv_kernel),
            "conv_stride": list(self.conv_stride), "conv_bias": self.conv_bias,
            "num_feat_extract_layers": len(self.conv_dim), "feat_extract_norm": self.feat_extract_norm,
            "feat_extract_activation": "gelu", "hidden_act": "gelu", "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers, "num_attention_heads": self.num_attention_heads,
            "intermediate_size": self.intermediate_size, "num_conv_pos_embeddings": self.num_conv_pos_embeddings,
            "num_conv_pos_embedding_groups": self.num_conv_pos_embedding_groups,
            "layer_norm_eps": self.layer_norm_eps, "do_stable_layer_norm": self.do_stable_layer_norm,
            "vocab_size": self.vocab_size, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
            "add_adapter": False, "use_weighted_layer_sum": False, "torch_dtype": "float32",
        }


def read_aligner_config(path: str | Path) -> AlignerConfig:
    """Read `config.json`. ValueError naming the file and the field for anything not implemented here."""
    path = Path(path)
    try:
        c = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path.name} is not a readable JSON file ({type(e).__name__}: {e})") from None
    if not isinstance(c, dict):
        raise ValueError(f"{path.name} is not a JSON object")
    try:
        if c.get("model_type") != "wav2vec2":
            raise ValueError(f"model_type is {c.get('model_type')!r}, expected 'wav2vec2' (a wav2vec2 CTC model)")
        arch = c.get("architectures") or ["Wav2Vec2ForCTC"]
        if "Wav2Vec2ForCTC" not in arch:
            raise ValueError(f"architectures is {arch}, expected Wav2Vec2ForCTC (a CTC head)")
        for key, allowed in (("hidden_act", "gelu"), ("feat_extract_activation", "gelu")):
            if c.get(key, allowed) != allowed:
                raise ValueError(f"{key} {c[key]!r} is not supported (only {allowed})")
        for key in ("add_adapter", "use_weighted_layer_sum"):
            if c.get(key):
                raise ValueError(f"{key} is not supported")
        if c.get("position_embeddings_type") not in (None, "conv"):
            raise ValueError(f"position_embeddings_type {c['position_embeddings_type']!r} is not supported")
        norm = c.get("feat_extract_norm", "group")
        if norm not in ("layer", "group"):
            raise ValueError(f"feat_extract_norm {norm!r} is not supported (layer or group)")
        conv_dim, conv_kernel, conv_stride = (tuple(int(v) for v in c[k])
                                              for k in ("conv_dim", "conv_kernel", "conv_stride"))
        if not len(conv_dim) == len(conv_kernel) == len(conv_stride) >= 1:
            raise ValueError("conv_dim, conv_kernel and conv_stride must be lists of one length")
        cfg = AlignerConfig(
            conv_dim=conv_dim, conv_kernel=conv_kernel, conv_stride=conv_stride,
            conv_bias=bool(c.get("conv_bias", False)), feat_extract_norm=norm,
            hidden_size=int(c["hidden_size"]), num_hidden_layers=int(c["num_hidden_layers"]),
            num_attention_heads=int(c["num_attention_heads"]), intermediate_size=int(c["intermediate_size"]),
            num_conv_pos_embeddings=int(c["num_conv_pos_embeddings"]),
            num_conv_pos_embedding_groups=int(c["num_conv_pos_embedding_groups"]),
            layer_norm_eps=float(c.get("layer_norm_eps", 1e-5)),
            do_stable_layer_norm=bool(c.get("do_stable_layer_norm", False)), vocab_size=int(c["vocab_size"]))
    except KeyError as e:
        raise ValueError(f"{path.name} has no {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path.name}: {e}") from None
    if cfg.hidden_size % cfg.num_attention_heads or cfg.hidden_size % cfg.num_conv_pos_embedding_groups:
        raise ValueError(f"{path.name}: hidden_size {cfg.hidden_size} is not a multiple of num_attention_heads "
                         "and num_conv_pos_embedding_groups")
    return cfg


__all__ = ["AlignerConfig", "read_aligner_config"]
