"""A random-weight forced-aligner directory in the published Hugging Face format of the MMS aligner
(`MahmoudAshraf/mms-300m-1130-forced-aligner`): config.json, vocab.json, preprocessor_config.json and
model.safetensors under the `Wav2Vec2ForCTC` names (the positional conv as `weight_g`/`weight_v`)."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from cosy.align.config import AlignerConfig
from cosy.align.wav2vec2 import Wav2Vec2ForCTC

# the published vocab.json: four specials (the CTC blank first), then MMS's 27 letters by frequency
VOCAB = ["<blank>", "<pad>", "</s>", "<unk>", *"aientousrmkldghybpwcvjzf", "'", "q", "x"]
SIZES = {
    "full": AlignerConfig(),  # MMS-300m as published
    # the conv strides (one frame per 20 ms) and the layer kinds kept; every width small
    "tiny": AlignerConfig(conv_dim=(16,) * 7, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                          intermediate_size=64, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4),
}
PREPROCESSOR = {"do_normalize": True, "feature_extractor_type": "Wav2Vec2FeatureExtractor", "feature_size": 1,
                "padding_side": "right", "padding_value": 0.0, "return_attention_mask": True,
                "sampling_rate": 16000}


def write(out: Path, size: str, seed: int, atomic_write) -> None:
    """The whole aligner directory for `size` ("tiny" or "full")."""
    cfg = SIZES[size]

    def text(name: str, value: dict) -> None:
        atomic_write(out / name, lambda p: p.write_text(json.dumps(value, indent=2), encoding="utf-8"))

    text("config.json", cfg.to_json())
    text("vocab.json", {t: i for i, t in enumerate(VOCAB)})
    text("preprocessor_config.json", PREPROCESSOR)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        model = Wav2Vec2ForCTC(cfg)
        # SpecAugment's mask vector: in the published checkpoint, unused by inference (cosy.align.wav2vec2)
        state = {**model.state_dict(), "wav2vec2.masked_spec_embed": torch.rand(cfg.hidden_size)}
    from safetensors.torch import save_file
    state = {k: v.contiguous() for k, v in state.items()}
    atomic_write(out / "model.safetensors", lambda p: save_file(state, str(p), metadata={"format": "pt"}))
