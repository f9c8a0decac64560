"""Streaming flow that computes only new frames: the estimator's per-step state of finished frames.

Both estimators have this path: CosyVoice2's U-Net (here) and CosyVoice3's DiT (`cosy.flow.dit_incremental`).

With chunk masks (streaming, non-final calls) a frame attends only to frames of its own and earlier
chunks, convolutions are causal and the CFM noise is sliced from frame 0, so the estimator's values on a
finished frame never change. To run the estimator on new frames only, each ODE step needs, of every earlier
frame, the keys and values of every attention layer and, for every causal conv, its last (kernel - 1)
input frames. `FlowState` holds exactly that, for both CFG rows; a call returns the state extended by
its new frames. States are never modified in place (tensors are concatenated into new ones), so one
saved voice's prompt state can seed many requests at once.

Exactness: the new frames see the same numbers as in the full computation; only matrix products on other
shapes round differently (max-abs ~1e-6 on the mel in fp32).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosy.flow.decoder import CausalBlock1D, CausalConditionalDecoder, CausalResnetBlock1D, timestep_embedding
from cosy.flow.dit import DiT
from cosy.flow.dit_incremental import estimate_dit
from cosy.flow.model import FlowModel

Step = dict[str, Tensor]  # name -> K/V (2, H, P, d) or conv tail (2, C, kernel - 1)


@dataclass(frozen=True)
class FlowState:
    """Estimator state of the first `frames` frames, one dict per ODE step."""

    frames: int
    steps: tuple[Step, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for step in self.steps for t in step.values())


def supports(flow: FlowModel) -> bool:
    """Whether this flow's estimator has the incremental path (U-Net or DiT, with full left context)."""
    est = flow.decoder.estimator
    return type(est) in ESTIMATES and est.cfg.num_decoding_left_chunks < 0


class _Run:
    """One estimator evaluation on new frames [past, past + n), reading `old` and filling `new`."""

    def __init__(self, old: Step | None, past: int, n: int, chunk: int, device):
        self.old, self.new, self.past = old or {}, {}, past
        rows = torch.arange(past, past + n, device=device)
        cols = torch.arange(past + n, device=device)
        self.mask = cols.unsqueeze(0) < ((rows // chunk + 1) * chunk).unsqueeze(1)  # (n, past + n)

    def conv(self, conv: nn.Conv1d, x: Tensor, name: str) -> Tensor:
        k = conv.kernel_size[0] - 1
        tail = self.old.get(name)
        if tail is None:
            tail = x.new_zeros(x.size(0), x.size(1), k)
        inp = torch.cat([tail, x], dim=2)
        self.new[name] = inp[:, :, -k:]
        return F.conv1d(inp, conv.weight, conv.bias)

    def block(self, b: CausalBlock1D, x: Tensor, name: str) -> Tensor:
        x = self.conv(b.block[0], x, name)
        for m in list(b.block)[1:]:
            x = m(x)
        return x

    def resnet(self, r: CausalResnetBlock1D, x: Tensor, t_emb: Tensor, name: str) -> Tensor:
        h = self.block(r.block1, x, name + ".1") + r.mlp(t_emb).unsqueeze(-1)
        return self.block(r.block2, h, name + ".2") + r.res_conv(x)

    def attention(self, attn, x: Tensor, name: str) -> Tensor:
        b, t, _ = x.shape
        q, k, v = (proj(x).view(b, t, attn.heads, attn.dim_head).transpose(1, 2)
                   for proj in (attn.to_q, attn.to_k, attn.to_v))
        if name + ".k" in self.old:
            k = torch.cat([self.old[name + ".k"], k], dim=2)
            v = torch.cat([self.old[name + ".v"], v], dim=2)
        self.new[name + ".k"], self.new[name + ".v"] = k, v
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)
        return attn.to_out[0](out.transpose(1, 2).reshape(b, t, attn.heads * attn.dim_head))

    def transformers(self, x: Tensor, blocks, name: str) -> Tensor:
        x = x.transpose(1, 2)
        for i, blk in enumerate(blocks):
            x = x + self.attention(blk.attn1, blk.norm1(x), f"{name}.{i}")
            x = x + blk.ff(blk.norm3(x))
        return x.transpose(1, 2)


def estimate(dec: CausalConditionalDecoder, run: _Run, x: Tensor, mu: Tensor, t: Tensor, spks: Tensor,
             cond: Tensor) -> Tensor:
    """The estimator's `forward(..., streaming=True)` restricted to the new frames of `run`."""
    t_emb = dec.time_mlp(timestep_embedding(t, dec.cfg.in_channels).to(x.dtype))
    h = torch.cat([x, mu, spks.unsqueeze(-1).expand(-1, -1, x.size(-1)), cond], dim=1)
    resnet, blocks, down = dec.down_blocks[0]
    skip = run.transformers(run.resnet(resnet, h, t_emb, "d.r"), blocks, "d.t")
    h = run.conv(down, skip, "d.c")
    for i, (resnet, blocks) in enumerate(dec.mid_blocks):
        h = run.transformers(run.resnet(resnet, h, t_emb, f"m{i}.r"), blocks, f"m{i}.t")
    resnet, blocks, up = dec.up_blocks[0]
    h = run.transformers(run.resnet(resnet, torch.cat([h, skip], dim=1), t_emb, "u.r"), blocks, "u.t")
    h = run.conv(up, h, "u.c")
    return dec.final_proj(run.block(dec.final_block, h, "f"))


# estimator class -> its forward(streaming=True) on new frames
ESTIMATES = {CausalConditionalDecoder: estimate, DiT: estimate_dit}


@torch.inference_mode()
def sample_new(flow: FlowModel, mu: Tensor, spks: Tensor, cond: Tensor, state: FlowState | None,
               stop: int | None = None) -> tuple[Tensor, FlowState]:
    """CFM sampling (streaming masks) of frames [state.frames, stop) given the state of earlier frames.

    mu, cond: (1, 80, >= stop) over all frames from 0; spks (1, 80). Returns the mel of the new frames
    (1, 80, stop - past) float32 and the state of frames [0, stop).
    """
    cfm, dec = flow.decoder, flow.decoder.estimator
    past = state.frames if state is not None else 0
    stop = mu.size(2) if stop is None else stop
    n = stop - past
    if stop > cfm.rand_noise.size(2):
        raise ValueError(f"flow input of {stop} frames exceeds the fixed noise ({cfm.rand_noise.size(2)} frames)")
    mu, cond = mu[:, :, past:stop], cond[:, :, past:stop]
    # the ODE state and times in float32, the estimator's inputs (and so its state) in its dtype
    dtype = cfm.estimator_dtype
    x = cfm.rand_noise[:, :, past:stop].to(device=mu.device, dtype=torch.float32)
    t_span = cfm.time_span(mu.device, torch.float32)
    rate = cfm.cfg.inference_cfg_rate
    mu_in = torch.cat([mu, torch.zeros_like(mu)]).to(dtype)
    spks_in = torch.cat([spks, torch.zeros_like(spks)]).to(dtype)
    cond_in = torch.cat([cond, torch.zeros_like(cond)]).to(dtype)
    steps = []
    t, dt = t_span[0], t_span[1] - t_span[0]
    for step in range(1, len(t_span)):
        run = _Run(state.steps[step - 1] if state is not None else None, past, n, dec.cfg.static_chunk_size,
                   mu.device)
        v = ESTIMATES[type(dec)](dec, run, torch.cat([x, x]).to(dtype), mu_in, t.expand(2), spks_in, cond_in).float()
        steps.append(run.new)
        x = x + dt * ((1.0 + rate) * v[:1] - rate * v[1:])
        t = t + dt
        if step < len(t_span) - 1:
            dt = t_span[step + 1] - t
    return x.float(), FlowState(stop, tuple(steps))


def prompt_frames(flow: FlowModel, n_prompt_tokens: int) -> int:
    """Frames of a prompt that are final without any target token: whole chunks whose 3 look-ahead tokens
    are still prompt tokens (all but the chunk that holds the prompt's last tokens)."""
    chunk = flow.stream_chunk_tokens
    final_chunks = max(0, (n_prompt_tokens - flow.cfg.pre_lookahead_len) // chunk)
    return final_chunks * chunk * flow.cfg.token_mel_ratio
