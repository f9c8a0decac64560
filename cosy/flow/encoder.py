"""The flow's token encoder: official `UpsampleConformerEncoder`.

tokens embedded (B, T, 512) -> linear embed -> pre-lookahead conv -> conformer blocks (chunk masks when
streaming) -> nearest x2 upsample + causal conv -> linear embed -> conformer blocks -> LayerNorm -> (B, 2T, 512).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosy.flow.config import EncoderConfig
from cosy.flow.conformer import ConformerEncoderLayer, LinearEmbed, chunk_mask, combine_masks, padding_mask


class PreLookaheadLayer(nn.Module):
    """Lets each token see `pre_lookahead_len` future tokens: conv over [x, look-ahead], causal conv, residual."""

    def __init__(self, channels: int, pre_lookahead_len: int, hidden: int | None = None):
        """`hidden`: width between the two convs (CosyVoice3: 1024 around 80 channels); default `channels`."""
        super().__init__()
        self.pre_lookahead_len = pre_lookahead_len
        hidden = channels if hidden is None else hidden
        self.conv1 = nn.Conv1d(channels, hidden, kernel_size=pre_lookahead_len + 1)
        self.conv2 = nn.Conv1d(hidden, channels, kernel_size=3)

    def forward(self, x: Tensor, context: Tensor | None = None) -> Tensor:
        """x (B, T, C), context (B, Tc <= pre_lookahead_len, C) = the embedded future tokens, or None -> (B, T, C)."""
        h = x.transpose(1, 2)
        n_ctx = 0
        if context is not None and context.size(1) > 0:
            h = torch.cat([h, context.transpose(1, 2)], dim=2)
            n_ctx = context.size(1)
        # Missing future tokens (end of utterance) are zeros.
        h = F.pad(h, (0, self.pre_lookahead_len - n_ctx))
        h = F.leaky_relu(self.conv1(h))
        h = self.conv2(F.pad(h, (self.conv2.kernel_size[0] - 1, 0)))
        return h.transpose(1, 2) + x


class Upsample1D(nn.Module):
    """Nearest-neighbour upsampling by `stride`, then a causal conv (left pad 2*stride, kernel 2*stride+1)."""

    def __init__(self, channels: int, out_channels: int, stride: int):
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv1d(channels, out_channels, stride * 2 + 1)

    def forward(self, x: Tensor) -> Tensor:
        """x (B, C, T) -> (B, C_out, stride*T)."""
        x = F.interpolate(x, scale_factor=float(self.stride), mode="nearest")
        return self.conv(F.pad(x, (self.stride * 2, 0)))


class UpsampleConformerEncoder(nn.Module):
    """Official `UpsampleConformerEncoder` (rel-pos conformer, linear input layer, x2 upsampling)."""

    def __init__(self, cfg: EncoderConfig):
        super().__init__()
        if cfg.input_size != cfg.output_size:
            # up_embed applies a Linear(input_size, ...) to the output_size-wide upsampled stream.
            raise ValueError(f"encoder input_size ({cfg.input_size}) must equal output_size ({cfg.output_size})")
        self.cfg = cfg
        d = cfg.output_size
        self.embed = LinearEmbed(cfg.input_size, d)
        self.pre_lookahead_layer = PreLookaheadLayer(d, cfg.pre_lookahead_len)
        self.encoders = nn.ModuleList(
            ConformerEncoderLayer(d, cfg.attention_heads, cfg.linear_units) for _ in range(cfg.num_blocks))
        self.up_layer = Upsample1D(d, d, cfg.upsample_stride)
        self.up_embed = LinearEmbed(cfg.input_size, d)
        self.up_encoders = nn.ModuleList(
            ConformerEncoderLayer(d, cfg.attention_heads, cfg.linear_units) for _ in range(cfg.num_up_blocks))
        self.after_norm = nn.LayerNorm(d, eps=1e-5)

    def forward(self, xs: Tensor, context: Tensor | None = None, streaming: bool = False,
                lengths: Tensor | None = None) -> Tensor:
        """Encode embedded tokens.

        Args:
            xs: (B, T, input_size) token embeddings (unpadded, or right-padded when `lengths` is given).
            context: (B, Tc, input_size) embeddings of look-ahead tokens that are not encoded themselves
                (streaming chunks that are not final), or None.
            streaming: use chunk attention masks (static_chunk_size tokens; x stride after upsampling).
            lengths: (B,) valid tokens per row of a padded batch (final rows only: no `context`), or None.
                Padded keys are masked in attention and padded frames are zeroed before every conv, so each
                row's valid frames equal its solo encoding; the padded output frames are meaningless.
        Returns:
            (B, stride*T, output_size)
        """
        cfg = self.cfg
        if lengths is not None and context is not None and context.size(1) > 0:
            raise ValueError("a padded batch takes no look-ahead context (final rows only)")
        xs, pos_emb = self.embed(xs)
        if context is not None and context.size(1) > 0:
            context, _ = self.embed(context)
        valid = None if lengths is None else padding_mask(lengths, xs.size(1))  # (B, T) True = real frame
        mask = chunk_mask(xs.size(1), cfg.static_chunk_size, -1, xs.device) if streaming else None
        mask = combine_masks(mask, valid)
        if valid is not None:  # the look-ahead conv must read zeros past a row's end, as solo
            xs = xs * valid.unsqueeze(-1)
        xs = self.pre_lookahead_layer(xs, context)
        for layer in self.encoders:
            xs = layer(xs, pos_emb, mask)

        if valid is not None:
            xs = xs * valid.unsqueeze(-1)
        xs = self.up_layer(xs.transpose(1, 2)).transpose(1, 2)
        xs, pos_emb = self.up_embed(xs)
        if valid is not None:
            valid = padding_mask(lengths * cfg.upsample_stride, xs.size(1))
        mask = (chunk_mask(xs.size(1), cfg.static_chunk_size * cfg.upsample_stride, -1, xs.device)
                if streaming else None)
        mask = combine_masks(mask, valid)
        for layer in self.up_encoders:
            xs = layer(xs, pos_emb, mask)
        return self.after_norm(xs)
