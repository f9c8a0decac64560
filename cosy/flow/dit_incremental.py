"""The DiT estimator on new frames only, from the per-step state of finished frames (`cosy.flow.incremental`).

Same reasoning as CosyVoice2's U-Net: with block-causal masks (all left blocks), left-causal convs and the
fixed noise sliced from frame 0, a finished frame's values never change. For the DiT the state of earlier
frames, per ODE step and for both CFG rows, is: the rotated keys and the values of every block's attention,
and the last (kernel - 1) inputs of both conv position-embedding convs. Rotary positions are absolute, so
new frames get positions past..stop-1 as in the full computation.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from cosy.flow.dit import DiT, rotate_first


def _conv(run, conv, x: Tensor, name: str) -> Tensor:
    """A left-padded (grouped) conv over (B, C, n) new frames, with the tail of earlier inputs from `run`."""
    k = conv.kernel_size[0] - 1
    tail = run.old.get(name)
    if tail is None:
        tail = x.new_zeros(x.size(0), x.size(1), k)
    inp = torch.cat([tail, x], dim=2)
    run.new[name] = inp[:, :, -k:]
    return F.conv1d(inp, conv.weight, conv.bias, groups=conv.groups)


def estimate_dit(dit: DiT, run, x: Tensor, mu: Tensor, t: Tensor, spks: Tensor, cond: Tensor) -> Tensor:
    """`dit(x, mu, t, spks, cond, streaming=True)` on the new frames [run.past, run.past + n) of x, mu, cond
    (B, 80, n), reading and extending `run`'s state (a `cosy.flow.incremental._Run`)."""
    t_emb = dit.time_embed(t)
    emb = dit.input_embed
    h = emb.proj(torch.cat([x.transpose(1, 2), cond.transpose(1, 2), mu.transpose(1, 2),
                            spks.unsqueeze(1).expand(-1, x.size(2), -1)], dim=-1))
    pos = emb.conv_pos_embed
    p = pos.conv1[1](_conv(run, pos.conv1[0], h.transpose(1, 2), "pos1"))
    p = pos.conv2[1](_conv(run, pos.conv2[0], p, "pos2"))
    h = p.transpose(1, 2) + h
    n = x.size(2)
    angles = dit.rotary_embed.angles(run.past + n, x.device)[run.past:]
    for i, block in enumerate(dit.transformer_blocks):
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = block.attn_norm.modulation(t_emb)
        a = block.attn_norm.norm(h) * (1 + scale_a) + shift_a
        h = h + gate_a * _attention(run, block.attn, a, angles, f"b{i}")
        f = block.ff_norm(h) * (1 + scale_f) + shift_f
        h = h + gate_f * block.ff(f)
    scale, shift = dit.norm_out.modulation(t_emb)
    h = dit.norm_out.norm(h) * (1 + scale) + shift
    return dit.proj_out(h).transpose(1, 2)


def _attention(run, attn, x: Tensor, angles: Tensor, name: str) -> Tensor:
    b, n, _ = x.shape
    q = rotate_first(attn.to_q(x), angles)
    k = rotate_first(attn.to_k(x), angles)
    q, k, v = (y.view(b, n, attn.heads, attn.dim_head).transpose(1, 2) for y in (q, k, attn.to_v(x)))
    k, v = run.extend(name, k, v)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=run.mask)
    return attn.to_out[0](out.transpose(1, 2).reshape(b, n, attn.heads * attn.dim_head))
