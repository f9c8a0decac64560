"""CosyVoice3's CFM velocity estimator: the official `DiT` (a diffusion transformer after F5-TTS).

x, cond, mu and spks are concatenated per frame and projected to `dim`; a causal conv position embedding
is added; `depth` AdaLN-zero transformer blocks conditioned on the flow time follow; a final AdaLN and a
linear layer give the velocity. Attention is full, or block-causal when streaming (frame i sees every
frame before the end of its `static_chunk_size` block, blocks counted from frame 0).

Quirk kept on purpose (official, via x-transformers): the rotary position embedding is applied to q and k
BEFORE the split into heads and covers only the first `dim_head` channels, i.e. head 0 alone is rotated;
channel pairs are adjacent (x0, x1), positions run 0..T-1 over prompt + target. Attribute names mirror
the official state-dict keys (`decoder.estimator.*` in flow.pt), including `rotary_embed.inv_freq`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosy.flow.conformer import chunk_mask, combine_masks, padding_mask
from cosy.flow.decoder import timestep_embedding
from cosy.flow.dit_config import DiTConfig


class TimestepEmbedding(nn.Module):
    """Flow time t (B,) -> (B, dim): sinusoid of 1000 t (sin half then cos half), Linear, SiLU, Linear."""

    def __init__(self, dim: int, freq_dim: int):
        super().__init__()
        self.freq_dim = freq_dim
        self.time_mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: Tensor) -> Tensor:
        # the sinusoid in float32 (see timestep_embedding), the MLP in the estimator's dtype
        return self.time_mlp(timestep_embedding(t, self.freq_dim).to(self.time_mlp[0].weight.dtype))


class CausalConvPositionEmbedding(nn.Module):
    """Two (left-padded grouped Conv1d, Mish) layers over (B, T, dim); keys conv1.0, conv2.0."""

    def __init__(self, dim: int, kernel_size: int, groups: int):
        super().__init__()
        self.kernel_size = kernel_size
        self.conv1 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups), nn.Mish())
        self.conv2 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups), nn.Mish())

    def forward(self, x: Tensor) -> Tensor:
        h = x.transpose(1, 2)
        h = self.conv1(F.pad(h, (self.kernel_size - 1, 0)))
        h = self.conv2(F.pad(h, (self.kernel_size - 1, 0)))
        return h.transpose(1, 2)


class InputEmbedding(nn.Module):
    """cat[x, cond, mu, spks] per frame -> Linear -> + causal conv position embedding. (B, T, dim)."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.proj = nn.Linear(2 * cfg.mel_dim + cfg.mu_dim + cfg.spk_dim, cfg.dim)
        self.conv_pos_embed = CausalConvPositionEmbedding(cfg.dim, cfg.conv_pos_kernel, cfg.conv_pos_groups)

    def forward(self, x: Tensor, cond: Tensor, mu: Tensor, spks: Tensor) -> Tensor:
        """x, cond (B, T, mel), mu (B, T, mu_dim), spks (B, spk_dim) -> (B, T, dim)."""
        h = self.proj(torch.cat([x, cond, mu, spks.unsqueeze(1).expand(-1, x.size(1), -1)], dim=-1))
        return self.conv_pos_embed(h) + h


class RotaryEmbedding(nn.Module):
    """x-transformers' rotary embedding: inv_freq (dim/2,) is a persistent buffer (it is in flow.pt)."""

    def __init__(self, dim: int, base: float = 10000.0):
        super().__init__()
        self.dim, self.base = dim, base
        # on the CPU even in a meta build (`empty_modules`): flow.pt's value replaces it at load, and the
        # meta kernels of these ops are Python ones that import torch._dynamo
        self.register_buffer("inv_freq", self._inv_freq(torch.device("cpu")))

    def _inv_freq(self, device: torch.device | None = None) -> Tensor:
        return 1.0 / self.base ** (torch.arange(0, self.dim, 2, device=device).float() / self.dim)

    def angles(self, seq_len: int, device: torch.device) -> Tensor:
        """(T, dim) float32 rotation angles, each frequency twice in a row (pairs are adjacent channels).

        Always float32 (as the official under autocast): a flow cast to half precision would otherwise
        round positions x frequencies to a few bits; the buffer is then recomputed (it equals flow.pt's).
        """
        inv = self.inv_freq if self.inv_freq.dtype == torch.float32 else self._inv_freq(device)
        freqs = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv)
        return torch.stack((freqs, freqs), dim=-1).flatten(-2)


def rotate_first(x: Tensor, angles: Tensor) -> Tensor:
    """Rotate the first angles.size(-1) channels of x (B, T, C) by angles (T, d) in adjacent pairs; the
    other channels pass unchanged (x-transformers' partial rotary)."""
    d = angles.size(-1)
    rot, rest = x[..., :d], x[..., d:]
    pairs = rot.unflatten(-1, (-1, 2))
    half = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)  # (x0, x1) -> (-x1, x0)
    rot = rot * angles.cos().to(x.dtype) + half * angles.sin().to(x.dtype)
    return torch.cat((rot, rest), dim=-1)


class Attention(nn.Module):
    """Self-attention with biased q/k/v; keys to_q, to_k, to_v, to_out.0 (official to_out.1: dropout)."""

    def __init__(self, dim: int, heads: int, dim_head: int):
        super().__init__()
        self.heads, self.dim_head = heads, dim_head
        inner = heads * dim_head
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(dim, inner)
        self.to_v = nn.Linear(dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])

    def forward(self, x: Tensor, mask: Tensor | None, angles: Tensor) -> Tensor:
        """x (B, T, dim), mask (T, T) / (B, 1, 1|T, T) bool (True = attend) or None, angles (T, dim_head)."""
        b, t, _ = x.shape
        q = rotate_first(self.to_q(x), angles)  # before the head split: head 0 only (official quirk)
        k = rotate_first(self.to_k(x), angles)
        v = self.to_v(x)
        q, k, v = (y.view(b, t, self.heads, self.dim_head).transpose(1, 2) for y in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        # The official zeroes query rows the last frame may not see (padding only): none when unpadded.
        return self.to_out[0](out.transpose(1, 2).reshape(b, t, self.heads * self.dim_head))


class AdaLayerNorm(nn.Module):
    """Linear(SiLU(t)) -> n chunks of modulation; LayerNorm without affine, eps 1e-6."""

    def __init__(self, dim: int, chunks: int):
        super().__init__()
        self.chunks = chunks
        self.linear = nn.Linear(dim, dim * chunks)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)

    def modulation(self, t_emb: Tensor) -> tuple[Tensor, ...]:
        """t_emb (B, dim) -> `chunks` tensors (B, 1, dim)."""
        return tuple(c.unsqueeze(1) for c in torch.chunk(self.linear(F.silu(t_emb)), self.chunks, dim=1))


class FeedForward(nn.Module):
    """Linear -> GELU (tanh) -> Linear; keys ff.0.0 and ff.2 (ff.1 is the official dropout)."""

    def __init__(self, dim: int, mult: int):
        super().__init__()
        inner = dim * mult
        self.ff = nn.Sequential(nn.Sequential(nn.Linear(dim, inner), nn.GELU(approximate="tanh")), nn.Identity(),
                                nn.Linear(inner, dim))

    def forward(self, x: Tensor) -> Tensor:
        return self.ff(x)


class DiTBlock(nn.Module):
    """AdaLN-zero block: attention and feed-forward, each modulated and gated by the time embedding."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.attn_norm = AdaLayerNorm(cfg.dim, 6)
        self.attn = Attention(cfg.dim, cfg.heads, cfg.dim_head)
        self.ff_norm = nn.LayerNorm(cfg.dim, elementwise_affine=False, eps=1e-6)
        self.ff = FeedForward(cfg.dim, cfg.ff_mult)

    def forward(self, x: Tensor, t_emb: Tensor, mask: Tensor | None, angles: Tensor) -> Tensor:
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = self.attn_norm.modulation(t_emb)
        h = self.attn_norm.norm(x) * (1 + scale_a) + shift_a
        x = x + gate_a * self.attn(h, mask, angles)
        h = self.ff_norm(x) * (1 + scale_f) + shift_f
        return x + gate_f * self.ff(h)


class DiT(nn.Module):
    """Velocity estimator v(x, t | mu, spks, cond) of CosyVoice3's CFM."""

    def __init__(self, cfg: DiTConfig):
        super().__init__()
        self.cfg = cfg
        self.time_embed = TimestepEmbedding(cfg.dim, cfg.time_embed_dim)
        self.input_embed = InputEmbedding(cfg)
        self.rotary_embed = RotaryEmbedding(cfg.dim_head)
        self.transformer_blocks = nn.ModuleList(DiTBlock(cfg) for _ in range(cfg.depth))
        self.norm_out = AdaLayerNorm(cfg.dim, 2)
        self.proj_out = nn.Linear(cfg.dim, cfg.out_channels)

    def mask(self, n: int, streaming: bool, device: torch.device) -> Tensor | None:
        """(n, n) block-causal mask when streaming, else None (full attention)."""
        if not streaming:
            return None
        return chunk_mask(n, self.cfg.static_chunk_size, self.cfg.num_decoding_left_chunks, device)

    def forward(self, x: Tensor, mu: Tensor, t: Tensor, spks: Tensor, cond: Tensor, streaming: bool = False,
                lengths: Tensor | None = None) -> Tensor:
        """Estimate the flow velocity.

        Args:
            x: (B, 80, T) current sample.  mu: (B, 80, T) upsampled token features.  t: (B,) flow time.
            spks: (B, 80) projected speaker embedding.  cond: (B, 80, T) prompt mel, zeros after.
            streaming: block-causal attention instead of full.
            lengths: (B,) valid frames per row of a right-padded batch, or None (unpadded). Padded keys are
                masked; every conv is left-causal, so a valid frame never reads padding; padded frames come
                back as zeros.
        Returns:
            (B, out_channels, T)
        """
        n = x.size(2)
        t_emb = self.time_embed(t)
        h = self.input_embed(x.transpose(1, 2), cond.transpose(1, 2), mu.transpose(1, 2), spks)
        angles = self.rotary_embed.angles(n, x.device)
        mask = self.mask(n, streaming, x.device)
        valid = None if lengths is None else padding_mask(lengths, n)  # (B, T)
        mask = combine_masks(mask, valid)
        for block in self.transformer_blocks:
            h = block(h, t_emb, mask, angles)
        scale, shift = self.norm_out.modulation(t_emb)  # official order: scale first
        h = self.norm_out.norm(h) * (1 + scale) + shift
        out = self.proj_out(h).transpose(1, 2)
        return out if valid is None else out * valid.unsqueeze(1).to(out.dtype)
