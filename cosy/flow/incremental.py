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
from cosy.preemption import preemption_point

Step = dict[str, Tensor]  # name -> K/V (2, H, P, d) or conv tail (2, C, kernel - 1)


@dataclass(frozen=True)
class FlowState:
    """Estimator state of the first `frames` frames, one dict per ODE step."""

    frames: int
    steps: tuple[Step, ...]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for step in self.steps for t in step.values())

    def compact(self) -> "FlowState":
        """This state in storage of its own: a row of a batched step is a view of the batch's tensors, which
        would keep the whole batch alive (and outside the budget's count) as long as the row lives."""
        if all(t.untyped_storage().nbytes() == t.numel() * t.element_size() for s in self.steps for t in s.values()):
            return self
        return FlowState(self.frames, tuple({k: v.clone() for k, v in s.items()} for s in self.steps))


def supports(flow: FlowModel) -> bool:
    """Whether this flow's estimator has the incremental path (U-Net or DiT, with full left context)."""
    est = flow.decoder.estimator
    return type(est) in ESTIMATES and est.cfg.num_decoding_left_chunks < 0


class _Old(dict):
    """The earlier frames' state of B rows at one ODE step, as the estimator reads it: name -> (2B, ...),
    row i's CFG pair at [2i, 2i + 2]. Built lazily per name: B = 1 reads the row's own tensors; B > 1
    stacks them, or (`extended`) writes them straight into the concatenation with the new frames."""

    def __init__(self, steps: list[Step]):
        super().__init__()
        self.steps = steps

    def __contains__(self, name) -> bool:
        return name in self.steps[0]

    def get(self, name, default=None):
        if name not in self.steps[0]:
            return default
        if len(self.steps) == 1:
            return self.steps[0][name]
        return torch.cat([s[name] for s in self.steps])

    def __getitem__(self, name):
        return self.get(name)

    def extended(self, name: str, new: Tensor) -> Tensor:
        """cat([old, new], dim=2) with one copy of the old state (the rows' K/V are the bulk of it)."""
        if len(self.steps) == 1:
            return torch.cat([self.steps[0][name], new], dim=2)
        past = self.steps[0][name].size(2)
        out = new.new_empty(new.size(0), new.size(1), past + new.size(2), *new.shape[3:])
        for i, s in enumerate(self.steps):
            out[2 * i:2 * i + 2, :, :past] = s[name]
        out[:, :, past:] = new
        return out


class _Run:
    """One estimator evaluation on new frames [past, past + n), reading `old` and filling `new`.

    The batch holds B rows of the same (past, n), each as its CFG pair (conditioned, unconditioned) at
    [2i, 2i + 2]; `old` is their state at this step (`_Old`), or {} for the first frames."""

    def __init__(self, old: dict, past: int, n: int, chunk: int, device):
        self.old, self.new, self.past = old, {}, past
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

    def extend(self, name: str, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of earlier and new frames (B*2, H, past + n, d); kept as the new state."""
        if name + ".k" in self.old:
            k, v = self.old.extended(name + ".k", k), self.old.extended(name + ".v", v)
        self.new[name + ".k"], self.new[name + ".v"] = k, v
        return k, v

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
        k, v = self.extend(name, k, v)
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
    return sample_new_rows(flow, [(mu, spks, cond, state)], stop)[0]


@torch.inference_mode()
def sample_new_rows(flow: FlowModel, rows: list[tuple[Tensor, Tensor, Tensor, FlowState | None]],
                    stop: int | None = None) -> list[tuple[Tensor, FlowState]]:
    """`sample_new` of B requests' chunks at the same place (equal state frames and stop) as one batch.

    rows: (mu, spks, cond, state) per request, shaped as for `sample_new`. Each result equals the row's
    solo `sample_new` to float rounding (the rows only share matrix products). A row's new state is a view
    of the batch's tensors (its CFG pair is contiguous in them), so nothing is copied to split it.
    """
    cfm, dec = flow.decoder, flow.decoder.estimator
    states = [r[3] for r in rows]
    past = states[0].frames if states[0] is not None else 0
    stop = rows[0][0].size(2) if stop is None else stop
    if any((s.frames if s is not None else 0) != past for s in states) or any(r[0].size(2) < stop for r in rows):
        raise ValueError("batched streaming rows must share their state frames and reach the same stop")
    n, b = stop - past, len(rows)
    if stop > cfm.rand_noise.size(2):
        raise ValueError(f"flow input of {stop} frames exceeds the fixed noise ({cfm.rand_noise.size(2)} frames)")
    # the ODE state and times in float32, the estimator's inputs (and so its state) in its dtype;
    # rows interleaved as CFG pairs: [cond 0, uncond 0, cond 1, uncond 1, ...]
    dtype = cfm.estimator_dtype
    dev = rows[0][0].device

    def pairs(t: Tensor) -> list[Tensor]:
        return [t, torch.zeros_like(t)]
    mu_in = torch.cat([p for mu, _, _, _ in rows for p in pairs(mu[:, :, past:stop])]).to(dtype)
    spks_in = torch.cat([p for _, spks, _, _ in rows for p in pairs(spks)]).to(dtype)
    cond_in = torch.cat([p for _, _, cond, _ in rows for p in pairs(cond[:, :, past:stop])]).to(dtype)
    x = cfm.rand_noise[:, :, past:stop].to(device=dev, dtype=torch.float32).expand(b, -1, -1)
    t_span = cfm.time_span(dev, torch.float32)
    rate = cfm.cfg.inference_cfg_rate
    estimate_fn = getattr(dec, "incremental_fn", None) or ESTIMATES[type(dec)]  # (compiled: --compile)
    steps = []
    t, dt = t_span[0], t_span[1] - t_span[0]
    for step in range(1, len(t_span)):
        old = _Old([s.steps[step - 1] for s in states]) if states[0] is not None else {}
        run = _Run(old, past, n, dec.cfg.static_chunk_size, dev)
        v = estimate_fn(dec, run, x.repeat_interleave(2, dim=0).to(dtype), mu_in, t.expand(2 * b),
                                 spks_in, cond_in).float()
        steps.append(run.new)
        x = x + dt * ((1.0 + rate) * v[0::2] - rate * v[1::2])
        t = t + dt
        if step < len(t_span) - 1:
            dt = t_span[step + 1] - t
            preemption_point()  # more urgent work (a listener's chunk) may run between two steps
    if b == 1:
        return [(x.float(), FlowState(stop, tuple(steps)))]
    return [(x[i:i + 1].float(), FlowState(stop, tuple({k: v[2 * i:2 * i + 2] for k, v in s.items()} for s in steps)))
            for i in range(b)]


def prompt_frames(flow: FlowModel, n_prompt_tokens: int) -> int:
    """Frames of a prompt that are final without any target token: whole chunks whose 3 look-ahead tokens
    are still prompt tokens (all but the chunk that holds the prompt's last tokens)."""
    chunk = flow.stream_chunk_tokens
    final_chunks = max(0, (n_prompt_tokens - flow.cfg.pre_lookahead_len) // chunk)
    return final_chunks * chunk * flow.cfg.token_mel_ratio
