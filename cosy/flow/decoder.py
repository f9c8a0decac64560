"""The CFM velocity estimator: official `CausalConditionalDecoder` (a 1-D U-Net of causal ResNet blocks and
transformer blocks, built from Matcha-TTS / diffusers parts).

A solo call is unpadded (one utterance, the CFG pair has equal lengths), so the official padding masks,
which would be all ones, are left out. A padded batch of utterances (`lengths`) gets key-padding masks in
attention and zeroed padded frames; every conv is causal or 1x1, so a valid frame never reads padding.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosy.flow.config import EstimatorConfig
from cosy.flow.conformer import chunk_mask, combine_masks, padding_mask


class CausalConv1d(nn.Conv1d):
    """Conv1d (stride 1) that pads kernel_size-1 zeros on the left, so frame t only sees frames <= t."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__(in_channels, out_channels, kernel_size)

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(F.pad(x, (self.kernel_size[0] - 1, 0)))


class Transpose(nn.Module):
    def __init__(self, dim0: int, dim1: int):
        super().__init__()
        self.dim0, self.dim1 = dim0, dim1

    def forward(self, x: Tensor) -> Tensor:
        return x.transpose(self.dim0, self.dim1)


class CausalBlock1D(nn.Module):
    """Causal conv k3 -> LayerNorm over channels -> Mish. (B, C_in, T) -> (B, C_out, T)."""

    def __init__(self, dim: int, dim_out: int):
        super().__init__()
        # Sequential indices mirror the official keys block.0 (conv) and block.2 (norm).
        self.block = nn.Sequential(CausalConv1d(dim, dim_out, 3), Transpose(1, 2), nn.LayerNorm(dim_out),
                                   Transpose(1, 2), nn.Mish())

    def forward(self, x: Tensor) -> Tensor:
        return self.block(x)


class CausalResnetBlock1D(nn.Module):
    """Two causal blocks with the time embedding added in between, plus a 1x1 residual conv."""

    def __init__(self, dim: int, dim_out: int, time_emb_dim: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Mish(), nn.Linear(time_emb_dim, dim_out))
        self.block1 = CausalBlock1D(dim, dim_out)
        self.block2 = CausalBlock1D(dim_out, dim_out)
        self.res_conv = nn.Conv1d(dim, dim_out, 1)

    def forward(self, x: Tensor, t_emb: Tensor) -> Tensor:
        """x (B, C_in, T), t_emb (B, time_emb_dim) -> (B, C_out, T)."""
        h = self.block1(x) + self.mlp(t_emb).unsqueeze(-1)
        return self.block2(h) + self.res_conv(x)


class Attention(nn.Module):
    """diffusers-style self-attention: to_q/k/v without bias, to_out.0 with bias."""

    def __init__(self, dim: int, heads: int, dim_head: int):
        super().__init__()
        self.heads, self.dim_head = heads, dim_head
        inner = heads * dim_head
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(dim, inner, bias=False)
        self.to_v = nn.Linear(dim, inner, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])  # official to_out.1 is a dropout

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """x (B, T, dim), mask (T, T) or (B, 1, T|1, T) bool (True = attend) or None -> (B, T, dim)."""
        b, t, _ = x.shape
        q, k, v = (proj(x).view(b, t, self.heads, self.dim_head).transpose(1, 2)
                   for proj in (self.to_q, self.to_k, self.to_v))
        # Official adds a -1e10 bias to masked keys; a boolean mask gives the same softmax.
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.to_out[0](out.transpose(1, 2).reshape(b, t, self.heads * self.dim_head))


class GELUProj(nn.Module):
    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out)

    def forward(self, x: Tensor) -> Tensor:
        return F.gelu(self.proj(x))


class FeedForward(nn.Module):
    """Linear -> GELU -> Linear, x4 width (keys net.0.proj, net.2)."""

    def __init__(self, dim: int, mult: int = 4):
        super().__init__()
        # Index 1 is the official (inference no-op) dropout; kept so the keys stay net.0 / net.2.
        self.net = nn.Sequential(GELUProj(dim, dim * mult), nn.Identity(), nn.Linear(dim * mult, dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class TransformerBlock(nn.Module):
    """Pre-norm self-attention + feed-forward (Matcha `BasicTransformerBlock`, no cross-attention)."""

    def __init__(self, dim: int, num_heads: int, head_dim: int):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn1 = Attention(dim, num_heads, head_dim)
        self.norm3 = nn.LayerNorm(dim)
        self.ff = FeedForward(dim)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        x = x + self.attn1(self.norm1(x), mask)
        return x + self.ff(self.norm3(x))


def timestep_embedding(t: Tensor, dim: int, scale: float = 1000.0) -> Tensor:
    """Sinusoidal embedding of flow time t (B,) -> (B, dim) float32: [sin, cos] of scale*t at geometric
    frequencies. Computed in float32 whatever t's dtype (scale*t reaches 1000: a half t would shift the
    phases by ~0.1 rad); callers cast the result to the estimator's dtype."""
    half = dim // 2
    freqs = torch.exp(torch.arange(half, device=t.device).float() * -(math.log(10000) / (half - 1)))
    args = scale * t.float().unsqueeze(1) * freqs.unsqueeze(0)
    return torch.cat((args.sin(), args.cos()), dim=-1)


class TimestepEmbedding(nn.Module):
    def __init__(self, in_channels: int, time_embed_dim: int):
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, time_embed_dim)
        self.linear_2 = nn.Linear(time_embed_dim, time_embed_dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear_2(F.silu(self.linear_1(x)))


def _stage(dim_in: int, dim: int, cfg: EstimatorConfig, time_dim: int) -> list[nn.Module]:
    blocks = nn.ModuleList(TransformerBlock(dim, cfg.num_heads, cfg.attention_head_dim) for _ in range(cfg.n_blocks))
    return [CausalResnetBlock1D(dim_in, dim, time_dim), blocks]


class CausalConditionalDecoder(nn.Module):
    """Velocity estimator v(x, t | mu, spks, cond): down stage, mid stages, up stage with a skip connection."""

    def __init__(self, cfg: EstimatorConfig):
        super().__init__()
        if len(cfg.channels) != 1:
            # CosyVoice2 uses one level; deeper U-Nets would need (non-causal) down/upsampling layers.
            raise NotImplementedError(f"only one channel level is supported, got channels={cfg.channels}")
        self.cfg = cfg
        c = cfg.channels[0]
        time_dim = c * 4
        self.time_mlp = TimestepEmbedding(cfg.in_channels, time_dim)
        down = _stage(cfg.in_channels, c, cfg, time_dim) + [CausalConv1d(c, c, 3)]
        self.down_blocks = nn.ModuleList([nn.ModuleList(down)])
        self.mid_blocks = nn.ModuleList(nn.ModuleList(_stage(c, c, cfg, time_dim)) for _ in range(cfg.num_mid_blocks))
        self.up_blocks = nn.ModuleList([nn.ModuleList(_stage(2 * c, c, cfg, time_dim) + [CausalConv1d(c, c, 3)])])
        self.final_block = CausalBlock1D(c, c)
        self.final_proj = nn.Conv1d(c, cfg.out_channels, 1)

    @staticmethod
    def _transformers(x: Tensor, blocks: nn.ModuleList, mask: Tensor | None, valid: Tensor | None = None) -> Tensor:
        if valid is not None:  # keep padded frames finite (0 * inf would reach valid rows through attention)
            x = x * valid.unsqueeze(1)
        x = x.transpose(1, 2)
        for block in blocks:
            x = block(x, mask)
        return x.transpose(1, 2)

    def forward(self, x: Tensor, mu: Tensor, t: Tensor, spks: Tensor, cond: Tensor, streaming: bool = False,
                lengths: Tensor | None = None) -> Tensor:
        """Estimate the flow velocity.

        Args:
            x: (B, 80, T) current sample.  mu: (B, 80, T) encoder output.  t: (B,) flow time in [0, 1]
            (best float32: the time embedding is computed from it in float32).
            spks: (B, 80) projected speaker embedding.  cond: (B, 80, T) prompt mel (zeros after the prompt).
            streaming: chunk attention (static_chunk_size frames, num_decoding_left_chunks) instead of full.
            lengths: (B,) valid frames per row of a right-padded batch, or None (unpadded).
        Returns:
            (B, out_channels, T)
        """
        cfg = self.cfg
        t_emb = self.time_mlp(timestep_embedding(t, cfg.in_channels).to(x.dtype))
        x = torch.cat([x, mu, spks.unsqueeze(-1).expand(-1, -1, x.size(-1)), cond], dim=1)
        mask = (chunk_mask(x.size(-1), cfg.static_chunk_size, cfg.num_decoding_left_chunks, x.device)
                if streaming else None)
        valid = None if lengths is None else padding_mask(lengths, x.size(-1)).to(x.dtype)  # (B, T)
        mask = combine_masks(mask, None if valid is None else valid.bool())
        if valid is not None:
            x = x * valid.unsqueeze(1)

        resnet, blocks, downsample = self.down_blocks[0]
        skip = self._transformers(resnet(x, t_emb), blocks, mask, valid)
        x = downsample(skip)
        for resnet, blocks in self.mid_blocks:
            x = self._transformers(resnet(x, t_emb), blocks, mask, valid)
        resnet, blocks, upsample = self.up_blocks[0]
        x = self._transformers(resnet(torch.cat([x, skip], dim=1), t_emb), blocks, mask, valid)
        x = upsample(x)
        out = self.final_proj(self.final_block(x))
        return out if valid is None else out * valid.unsqueeze(1)
