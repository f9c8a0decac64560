"""The Qwen2 backbone of the speech LM (inference only), with a preallocated KV cache.

Module names follow the official keys (`llm.model.model.embed_tokens`, `.layers.N.self_attn.q_proj`, ...), so
llm.pt loads strictly. The 151936-way text `lm_head` is deliberately absent: CosyVoice2 never uses it (its
logits come from `llm_decoder`), and computing it cost a quarter of each official decode step.
Numerics follow transformers' Qwen2 (RMSNorm in float32, RoPE tables in float32, q/k/v bias, no o bias).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosy.lm.config import LMConfig
from cosy.model.precision import cpu_bf16_units


def _onednn_linear_works() -> bool:
    """Whether this torch build has oneDNN's linear op (a private op: checked, never assumed)."""
    try:
        w, x = torch.ones(2, 3), torch.ones(1, 3)
        return torch.equal(torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""), F.linear(x, w))
    except Exception:  # missing op or kernel: any failure means "use F.linear"
        return False


_ONEDNN = _onednn_linear_works()


def _identity(w: Tensor) -> tuple[int, int]:
    """The weight's storage and version: a packed copy is current while both are what they were (an
    inference tensor has no version counter, and in-place changes to it happen under inference mode only)."""
    return w.data_ptr(), -1 if w.is_inference() else w._version


class Linear(nn.Linear):
    """nn.Linear that, for inference on the CPU, calls oneDNN's linear (torch's own inductor kernel): in
    float32 on the weight as it is, in bfloat16 on a copy of it prepacked by `pack` (where the CPU has bf16
    units: `pack_linears`).

    Why: decode reads every weight for one token, so it is bound by how fast the kernel streams them. ATen's
    float32 CPU linear measured ~17 GB/s for one token on our 2-core AMD machines, oneDNN ~35 GB/s. In
    bfloat16, ATen's and oneDNN's linear on a plain weight read it slower than float32's byte rate for one
    token, so half the bytes gain little; on a weight prepacked into oneDNN's blocked layout the bf16 units
    read it at about float32's byte rate (docs/deployment/precision.md). Everywhere else (GPU, autograd, a
    weight changed since it was packed) it is plain F.linear.
    """

    _packed: tuple[Tensor, int, int] | None = None  # (packed weight, the weight's `_identity` then)

    def pack(self) -> bool:
        """Keep a oneDNN-packed copy of this bfloat16 CPU weight for the forward (the copy costs the weight's
        size again); False (nothing kept) where there is none to make."""
        w = self.weight
        if not (_ONEDNN and w.device.type == "cpu" and w.dtype == torch.bfloat16):
            return False
        try:
            # the batch size is a hint for the layout: measured the same speed for 1 to 8 rows
            packed = torch.ops.mkldnn._reorder_linear_weight(w.detach(), 1)
        except RuntimeError:  # this CPU's oneDNN has no bf16 kernel (e.g. no AVX512-BW, or an ISA cap)
            return False
        self._packed = (packed, *_identity(w))
        return True

    def forward(self, x: Tensor) -> Tensor:
        # under torch.compile (`--compile`) inductor picks its own CPU kernels (and cannot lower this op)
        if (_ONEDNN and x.device.type == "cpu" and not torch.is_grad_enabled()
                and not torch.compiler.is_compiling()):
            if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
                return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
            packed = self._packed
            if packed is not None and x.dtype == torch.bfloat16 and packed[1:] == _identity(self.weight):
                # 2-D: the same op on a 3-D input measured slower
                y = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, x.size(-1)), packed[0], self.bias, "none",
                                                       [], "")
                return y.view(*x.shape[:-1], y.size(-1))
        return F.linear(x, self.weight, self.bias)


def pack_linears(module: nn.Module) -> int:
    """Prepack the bfloat16 CPU weights of every `Linear` in `module` for oneDNN (`Linear.pack`) where the
    CPU has bfloat16 units (`cosy.model.precision.cpu_bf16_units`; without them the packed kernel is no
    faster than F.linear, so nothing is packed). How many were packed."""
    if cpu_bf16_units() is None:
        return 0
    return sum(m.pack() for m in module.modules() if isinstance(m, Linear))


class KVCache:
    """Keys and values of every layer for one sequence, preallocated to `max_len` positions.

    k, v: (num_layers, 1, num_kv_heads, max_len, head_dim). `length` positions are filled.
    Owned by a single request; never shared.
    """

    def __init__(self, cfg: LMConfig, max_len: int, device: torch.device | str, dtype: torch.dtype):
        shape = (cfg.num_hidden_layers, 1, cfg.num_key_value_heads, max_len, cfg.head_dim)
        self.k = torch.empty(shape, device=device, dtype=dtype)
        self.v = torch.empty(shape, device=device, dtype=dtype)
        self.length = 0
        self.max_len = max_len


class RotaryTable:
    """cos/sin of rotary embeddings for positions 0..max_len-1, (max_len, head_dim) each, in the model dtype.

    Computed as transformers does: inv_freq and angles in float32, then cast.
    """

    def __init__(self, cfg: LMConfig, max_len: int, device: torch.device | str, dtype: torch.dtype):
        d = cfg.head_dim
        inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d))
        pos = torch.arange(max_len, device=device, dtype=torch.float32)
        freqs = pos[:, None] * inv_freq[None, :]
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = emb.cos().to(dtype)
        self.sin = emb.sin().to(dtype)


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class Qwen2RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def grouped_attention(q: Tensor, k: Tensor, v: Tensor, expand: bool | None = None, **kw) -> Tensor:
    """SDPA of q (B, heads, L, D) over grouped k/v (B, kv_heads, T, D). `expand`: repeat each k/v head for its
    group first; None: on CUDA in float32 only (there the memory-efficient kernel refuses `enable_gqa` and SDPA
    would fall to its slowest, math kernel; flash, for half dtypes, and the CPU take the groups as they are)."""
    if expand is None:
        expand = q.is_cuda and q.dtype == torch.float32
    if expand:
        group = q.size(1) // k.size(1)
        return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), **kw)
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kw)


class Qwen2Attention(nn.Module):
    def __init__(self, cfg: LMConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv, self.head_dim = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        h = cfg.hidden_size
        self.q_proj = Linear(h, self.n_heads * self.head_dim, bias=True)
        self.k_proj = Linear(h, self.n_kv * self.head_dim, bias=True)
        self.v_proj = Linear(h, self.n_kv * self.head_dim, bias=True)
        self.o_proj = Linear(self.n_heads * self.head_dim, h, bias=False)

    def qkv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (B, L, H) -> q (B, heads, L, D), k and v (B, kv_heads, L, D), q and k rotated (cos/sin broadcast
        over them: (L, D) for one sequence, (B, 1, 1, D) for rows at positions of their own)."""
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.n_kv, self.head_dim).transpose(1, 2)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache, start: int) -> Tensor:
        """x: (1, L, H) at positions start..start+L-1; cos/sin: (L, head_dim). Appends k/v to the cache."""
        b, n, _ = x.shape
        q, k, v = self.qkv(x, cos, sin)
        end = start + n
        k_all, v_all = cache.k[self.layer_idx, :, :, :end], cache.v[self.layer_idx, :, :, :end]
        k_all[:, :, start:].copy_(k)
        v_all[:, :, start:].copy_(v)
        # branch on the lengths in Python (not `is_causal=n > 1`): under `--compile` n is symbolic, and a
        # symbolic bool argument broke the graph, which sent the whole stack back to eager
        if n == 1:  # decode (or a 1-position prefill): the new position sees everything
            out = grouped_attention(q, k_all, v_all)
        elif start == 0:  # prefill: plain causal
            out = grouped_attention(q, k_all, v_all, is_causal=True)
        else:  # a chunk after a cache: causal within the chunk, offset by `start`
            mask = torch.ones(n, end, dtype=torch.bool, device=x.device).tril(diagonal=start)
            out = grouped_attention(q, k_all, v_all, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, self.n_heads * self.head_dim))


class Qwen2MLP(nn.Module):
    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Qwen2DecoderLayer(nn.Module):
    def __init__(self, cfg: LMConfig, layer_idx: int):
        super().__init__()
        self.self_attn = Qwen2Attention(cfg, layer_idx)
        self.mlp = Qwen2MLP(cfg)
        self.input_layernorm = Qwen2RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = Qwen2RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache, start: int) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, start)
        return x + self.mlp(self.post_attention_layernorm(x))


class Qwen2Model(nn.Module):
    """Embeddings, decoder layers and final norm (transformers' `Qwen2Model`)."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Qwen2DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = Qwen2RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, inputs_embeds: Tensor, cache: KVCache, rope: RotaryTable) -> Tensor:
        """inputs_embeds: (1, L, H), the next L positions after `cache.length`. Returns the final-normed
        hidden states (1, L, H) and advances the cache."""
        start, n = cache.length, inputs_embeds.size(1)
        if start + n > cache.max_len:
            raise ValueError(f"KV cache full: {start} + {n} positions > {cache.max_len}")
        cos, sin = rope.cos[start:start + n], rope.sin[start:start + n]
        x = inputs_embeds
        for layer in self.layers:
            x = layer(x, cos, sin, cache, start)
        cache.length = start + n
        return self.norm(x)


class Qwen2ForCausalLM(nn.Module):
    """Key layout of transformers' `Qwen2ForCausalLM` (`.model`), without the unused tied `lm_head`."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.model = Qwen2Model(cfg)


class Qwen2Encoder(nn.Module):
    """The official `Qwen2Encoder` wrapper (`.model`), hence the `llm.model.model.*` keys."""

    def __init__(self, cfg: LMConfig):
        super().__init__()
        self.model = Qwen2ForCausalLM(cfg)
