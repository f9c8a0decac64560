"""wav2vec2 with a CTC head (inference only): audio at 16 kHz -> per-frame log-probabilities over the vocabulary.

Module names follow the Hugging Face `Wav2Vec2ForCTC` keys (`wav2vec2.feature_extractor.conv_layers.N.conv`,
`wav2vec2.encoder.layers.N.attention.q_proj`, `lm_head`, ...), so the published `model.safetensors` /
`pytorch_model.bin` loads strictly. The positional conv is weight-normed (dim 2) as published: its
`weight_g`/`weight_v` (or the newer `parametrizations.weight.original0/1`) are kept and the conv weight is
folded from them once (`fold_weight_norm`), not on every call.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosy.align.config import AlignerConfig


class ConvLayer(nn.Module):
    """One feature-encoder conv: conv -> norm ("layer": LayerNorm over channels; "group": GroupNorm with one
    group per channel, first layer only; none) -> GELU."""

    def __init__(self, cfg: AlignerConfig, i: int):
        super().__init__()
        cin = 1 if i == 0 else cfg.conv_dim[i - 1]
        cout = cfg.conv_dim[i]
        self.conv = nn.Conv1d(cin, cout, cfg.conv_kernel[i], stride=cfg.conv_stride[i], bias=cfg.conv_bias)
        self.kind = cfg.feat_extract_norm if cfg.feat_extract_norm == "layer" or i == 0 else "none"
        if self.kind == "layer":
            self.layer_norm = nn.LayerNorm(cout)
        elif self.kind == "group":
            self.layer_norm = nn.GroupNorm(cout, cout)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, C_in, N) -> (B, C_out, N')."""
        x = self.conv(x)
        if self.kind == "layer":
            x = self.layer_norm(x.transpose(1, 2)).transpose(1, 2)
        elif self.kind == "group":
            x = self.layer_norm(x)
        return F.gelu(x)


class FeatureEncoder(nn.Module):
    def __init__(self, cfg: AlignerConfig):
        super().__init__()
        self.conv_layers = nn.ModuleList(ConvLayer(cfg, i) for i in range(len(cfg.conv_dim)))

    def forward(self, wav: Tensor) -> Tensor:
        """wav: (B, N) -> (B, conv_dim[-1], T)."""
        x = wav[:, None]
        for layer in self.conv_layers:
            x = layer(x)
        return x


class FeatureProjection(nn.Module):
    def __init__(self, cfg: AlignerConfig):
        super().__init__()
        self.layer_norm = nn.LayerNorm(cfg.conv_dim[-1], eps=cfg.layer_norm_eps)
        self.projection = nn.Linear(cfg.conv_dim[-1], cfg.hidden_size)

    def forward(self, x: Tensor) -> Tensor:
        """x: (B, T, conv_dim[-1]) -> (B, T, hidden)."""
        return self.projection(self.layer_norm(x))


class WeightNormConv1d(nn.Module):
    """Conv1d whose weight is g * v / ||v||, the norm over every dim but 2 (the kernel position)."""

    def __init__(self, channels: int, kernel: int, groups: int):
        super().__init__()
        v = torch.empty(channels, channels // groups, kernel)
        nn.init.normal_(v, std=(2 / (v.shape[1] * kernel)) ** 0.5)  # only a model never loaded uses these
        self.weight_v = nn.Parameter(v)
        self.weight_g = nn.Parameter(torch.norm_except_dim(v, 2, 2))  # as weight_norm starts: weight = v
        self.bias = nn.Parameter(torch.zeros(channels))
        self.padding = kernel // 2
        self.groups = groups
        self._weight: Tensor | None = None

    def weight(self) -> Tensor:
        if self._weight is not None:
            return self._weight
        return torch._weight_norm(self.weight_v, self.weight_g, 2)

    def fold_weight_norm(self) -> None:
        """Compute the conv weight once (after loading): inference never changes g or v."""
        with torch.no_grad():
            self._weight = torch._weight_norm(self.weight_v, self.weight_g, 2).detach()

    def forward(self, x: Tensor) -> Tensor:
        return F.conv1d(x, self.weight(), self.bias, padding=self.padding, groups=self.groups)


class PositionalConvEmbedding(nn.Module):
    def __init__(self, cfg: AlignerConfig):
        super().__init__()
        k = cfg.num_conv_pos_embeddings
        self.conv = WeightNormConv1d(cfg.hidden_size, k, cfg.num_conv_pos_embedding_groups)
        self.trim = 1 if k % 2 == 0 else 0  # an even kernel with k//2 padding gives one frame too many

    def forward(self, h: Tensor) -> Tensor:
        """h: (B, T, hidden) -> (B, T, hidden)."""
        x = self.conv(h.transpose(1, 2))
        if self.trim:
            x = x[:, :, :-self.trim]
        return F.gelu(x).transpose(1, 2)


class Attention(nn.Module):
    def __init__(self, cfg: AlignerConfig):
        super().__init__()
        d = cfg.hidden_size
        self.heads = cfg.num_attention_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d, d) for _ in range(4))

    def forward(self, h: Tensor) -> Tensor:
        """h: (B, T, hidden), every frame attending to every frame -> (B, T, hidden)."""
        b, t, d = h.shape

        def heads(x: Tensor) -> Tensor:
            return x.view(b, t, self.heads, d // self.heads).transpose(1, 2)

        out = F.scaled_dot_product_attention(heads(self.q_proj(h)), heads(self.k_proj(h)), heads(self.v_proj(h)))
        return self.out_proj(out.transpose(1, 2).reshape(b, t, d))


class FeedForward(nn.Module):
    def __init__(self, cfg: AlignerConfig):
        super().__init__()
        self.intermediate_dense = nn.Linear(cfg.hidden_size, cfg.intermediate_size)
        self.output_dense = nn.Linear(cfg.intermediate_size, cfg.hidden_size)

    def forward(self, h: Tensor) -> Tensor:
        return self.output_dense(F.gelu(self.intermediate_dense(h)))


class EncoderLayer(nn.Module):
    """Pre-norm ("stable": norm -> attention -> residual, norm -> feed-forward -> residual) or post-norm."""

    def __init__(self, cfg: AlignerConfig):
        super().__init__()
        self.stable = cfg.do_stable_layer_norm
        self.attention = Attention(cfg)
        self.layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.feed_forward = FeedForward(cfg)
        self.final_layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)

    def forward(self, h: Tensor) -> Tensor:
        if self.stable:
            h = h + self.attention(self.layer_norm(h))
            return h + self.feed_forward(self.final_layer_norm(h))
        h = self.layer_norm(h + self.attention(h))
        return self.final_layer_norm(h + self.feed_forward(h))


class Encoder(nn.Module):
    def __init__(self, cfg: AlignerConfig):
        super().__init__()
        self.stable = cfg.do_stable_layer_norm
        self.pos_conv_embed = PositionalConvEmbedding(cfg)
        self.layer_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_eps)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, h: Tensor) -> Tensor:
        """h: (B, T, hidden) -> (B, T, hidden). Stable: the final LayerNorm after the layers, else before."""
        h = h + self.pos_conv_embed(h)
        if not self.stable:
            h = self.layer_norm(h)
        for layer in self.layers:
            h = layer(h)
        return self.layer_norm(h) if self.stable else h


class Wav2Vec2(nn.Module):
    def __init__(self, cfg: AlignerConfig):
        super().__init__()
        self.feature_extractor = FeatureEncoder(cfg)
        self.feature_projection = FeatureProjection(cfg)
        self.encoder = Encoder(cfg)


class Wav2Vec2ForCTC(nn.Module):
    """`forward(wav)`: (B, N) float audio at `cfg.sampling_rate` -> (B, T, vocab) CTC logits,
    T = `cfg.num_frames(N)`."""

    def __init__(self, cfg: AlignerConfig):
        super().__init__()
        self.cfg = cfg
        self.wav2vec2 = Wav2Vec2(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size)

    def forward(self, wav: Tensor) -> Tensor:
        m = self.wav2vec2
        feats = m.feature_extractor(wav).transpose(1, 2)
        return self.lm_head(m.encoder(m.feature_projection(feats)))

    def fold_weight_norm(self) -> None:
        self.wav2vec2.encoder.pos_conv_embed.conv.fold_weight_norm()


# keys a published checkpoint may hold that inference does not use (HF writes `masked_spec_embed` for
# SpecAugment; the pretraining heads are absent from a CTC checkpoint but harmless)
IGNORED_KEYS = ("wav2vec2.masked_spec_embed",)
_PARAMETRIZED = {"parametrizations.weight.original0": "weight_g", "parametrizations.weight.original1": "weight_v"}


def canonical_keys(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The checkpoint's tensors under our names: newer transformers save the weight-normed conv as
    `parametrizations.weight.original0/1`, older ones (and fairseq conversions) as `weight_g`/`weight_v`."""
    out = {}
    for k, v in state.items():
        if k in IGNORED_KEYS:
            continue
        for old, new in _PARAMETRIZED.items():
            if k.endswith(old):
                k = k[: -len(old)] + new
        out[k] = v
    return out


__all__ = ["Wav2Vec2ForCTC", "canonical_keys", "IGNORED_KEYS"]
