"""Conformer building blocks of the flow encoder (ESPnet/WeNet style, as used by CosyVoice2).

Only what the CosyVoice2 encoder uses: pre-norm layers, relative-position self-attention with the ESPnet
("new") relative positional encoding, a SiLU feed-forward, no macaron FFN and no convolution module.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def chunk_mask(size: int, chunk_size: int, num_left_chunks: int = -1, device: torch.device | None = None) -> Tensor:
    """Streaming attention mask (size, size), True = may attend.

    Frame i sees every frame up to the end of its own chunk, and `num_left_chunks` chunks to the left
    (all of them when negative).
    """
    pos = torch.arange(size, device=device)
    chunk = pos // chunk_size
    end = (chunk + 1) * chunk_size
    mask = pos.unsqueeze(0) < end.unsqueeze(1)
    if num_left_chunks >= 0:
        start = ((chunk - num_left_chunks) * chunk_size).clamp(min=0)
        mask &= pos.unsqueeze(0) >= start.unsqueeze(1)
    return mask


def padding_mask(lengths: Tensor, size: int) -> Tensor:
    """(B,) lengths -> (B, size) bool, True on each row's first lengths[b] frames."""
    return torch.arange(size, device=lengths.device).unsqueeze(0) < lengths.to(torch.long).unsqueeze(1)


def combine_masks(mask: Tensor | None, valid: Tensor | None) -> Tensor | None:
    """An attention mask (T, T) or None and a key-padding mask (B, T) or None -> (T, T), (B, 1, T|1, T) or None."""
    if valid is None:
        return mask
    keys = valid[:, None, None, :]  # (B, 1, 1, T)
    return keys if mask is None else keys & mask


def rel_position_encoding(size: int, d_model: int, device: torch.device | None = None,
                          dtype: torch.dtype = torch.float32) -> Tensor:
    """ESPnet relative positional encoding for relative positions size-1 ... -(size-1): (1, 2*size-1, d_model)."""
    # Same float32 arithmetic as the official table (positions times div_term, then sin/cos).
    position = torch.arange(size - 1, -size, -1, dtype=torch.float32, device=device).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32, device=device)
                         * -(math.log(10000.0) / d_model))
    pe = torch.zeros(2 * size - 1, d_model, device=device)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe.unsqueeze(0).to(dtype)


class LinearEmbed(nn.Module):
    """Linear + LayerNorm input layer followed by the x*sqrt(d) scaling of the rel-pos encoding.

    Mirrors the official `LinearNoSubsampling(..., EspnetRelPositionalEncoding)` (keys `out.0`, `out.1`).
    """

    def __init__(self, idim: int, odim: int):
        super().__init__()
        self.out = nn.Sequential(nn.Linear(idim, odim), nn.LayerNorm(odim, eps=1e-5))
        self.xscale = math.sqrt(odim)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, T, idim) -> x (B, T, odim), pos_emb (1, 2T-1, odim)."""
        x = self.out(x) * self.xscale
        return x, rel_position_encoding(x.size(1), x.size(2), x.device, x.dtype)


def rel_shift(x: Tensor) -> Tensor:
    """(B, H, T, 2T-1) scores against relative positions T-1..-(T-1) -> (B, H, T, T) scores per key.

    out[..., i, j] = x[..., i, T-1-i+j], i.e. the entry for relative position i-j.
    """
    b, h, t, n = x.shape
    x = x.contiguous()
    s = x.stride()
    return x.as_strided((b, h, t, t), (s[0], s[1], s[2] - 1, s[3]), x.storage_offset() + t - 1)


class RelPositionMultiHeadedAttention(nn.Module):
    """Transformer-XL style self-attention with learned biases u/v (official `RelPositionMultiHeadedAttention`)."""

    def __init__(self, n_head: int, n_feat: int):
        super().__init__()
        assert n_feat % n_head == 0
        self.h = n_head
        self.d_k = n_feat // n_head
        self.linear_q = nn.Linear(n_feat, n_feat)
        self.linear_k = nn.Linear(n_feat, n_feat)
        self.linear_v = nn.Linear(n_feat, n_feat)
        self.linear_out = nn.Linear(n_feat, n_feat)
        self.linear_pos = nn.Linear(n_feat, n_feat, bias=False)
        self.pos_bias_u = nn.Parameter(torch.empty(self.h, self.d_k))
        self.pos_bias_v = nn.Parameter(torch.empty(self.h, self.d_k))
        nn.init.xavier_uniform_(self.pos_bias_u)
        nn.init.xavier_uniform_(self.pos_bias_v)

    def forward(self, x: Tensor, pos_emb: Tensor, mask: Tensor | None) -> Tensor:
        """x (B, T, D), pos_emb (1, 2T-1, D), mask (T, T) or (B, 1, T|1, T) bool or None (full attention)
        -> (B, T, D)."""
        b, t, _ = x.shape
        q = self.linear_q(x).view(b, t, self.h, self.d_k)
        k = self.linear_k(x).view(b, t, self.h, self.d_k).transpose(1, 2)
        v = self.linear_v(x).view(b, t, self.h, self.d_k).transpose(1, 2)
        p = self.linear_pos(pos_emb).view(1, -1, self.h, self.d_k).transpose(1, 2)  # (1, H, 2T-1, d_k)
        q_u = (q + self.pos_bias_u).transpose(1, 2)
        q_v = (q + self.pos_bias_v).transpose(1, 2)
        # Position term (matrix bd) enters SDPA as an additive bias; content term (matrix ac) is SDPA's q.k.
        bias = rel_shift(torch.matmul(q_v, p.transpose(-2, -1))) / math.sqrt(self.d_k)
        if mask is not None:
            # Official: -inf fill, softmax, zero fill; identical as long as no row is fully masked.
            bias = bias.masked_fill(~mask, float("-inf"))
        out = F.scaled_dot_product_attention(q_u, k, v, attn_mask=bias)
        return self.linear_out(out.transpose(1, 2).reshape(b, t, self.h * self.d_k))


class PositionwiseFeedForward(nn.Module):
    """Linear -> SiLU -> Linear."""

    def __init__(self, idim: int, hidden_units: int):
        super().__init__()
        self.w_1 = nn.Linear(idim, hidden_units)
        self.w_2 = nn.Linear(hidden_units, idim)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(F.silu(self.w_1(x)))


class ConformerEncoderLayer(nn.Module):
    """Pre-norm block: x + MHA(LN(x)), then x + FFN(LN(x)) (no macaron FFN, no conv module)."""

    def __init__(self, size: int, attention_heads: int, linear_units: int):
        super().__init__()
        self.self_attn = RelPositionMultiHeadedAttention(attention_heads, size)
        self.feed_forward = PositionwiseFeedForward(size, linear_units)
        # eps 1e-5 as in the official encoder_layer.py (ESPnet/WeNet use 1e-12; the golden cannot tell them apart).
        self.norm_ff = nn.LayerNorm(size, eps=1e-5)
        self.norm_mha = nn.LayerNorm(size, eps=1e-5)

    def forward(self, x: Tensor, pos_emb: Tensor, mask: Tensor | None) -> Tensor:
        """x (B, T, D) -> (B, T, D)."""
        x = x + self.self_attn(self.norm_mha(x), pos_emb, mask)
        return x + self.feed_forward(self.norm_ff(x))
