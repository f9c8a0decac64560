"""The exact RAS next-token distribution (`cosy.lm.sampling.ras_distribution`) for a whole batch at once, as
log-probs on the logits' device: what the vLLM logits processor (`cosy.vllm_plugin.ras`) hands vLLM's plain
sampler. Pure tensor code (no vLLM import), no device->host copy for the default parameters (top_k <= 32).

Per row, with s the float32 log-softmax scores (eos masked before min_len), p = softmax(s) sorted once
(descending, stable), the nucleus is the official one: token j is kept while the float32 *sequential* running
sum of the kept probs before it is < top_p (compared in float32, as the official `cum_prob < top_p` on a
float32 tensor) and fewer than top_k are kept. The running sum is one float32 add per column over the first
max(top_k) columns, so its rounding is the official loop's exactly (torch.cumsum accumulates in float64 on the
CPU and in parallel on CUDA: neither would do).

With p_n the renormalised nucleus and R the kept tokens with p_n > 0 repeated in the row's window,
    P(x) = p_n(x) [x not in R] + sum_{y in R} p_n(y) p_f^(-y)(x),
and p_f^(-y) = softmax(s with y at -inf) is never materialised per y: with M the top score and
e = exp(s - M) (float64 of the float32 scores, with the entries that float32 softmax rounds to 0 set to 0, so
the official zeros without float32's subnormal precision loss), for y not the top token
p_f^(-y)(x) = e_x / (S - e_y) [x != y] with S = sum e (no cancellation: p(y) <= 1/2), and for the top token
y0 the masked softmax is computed directly against the second-largest score (as `softmax` would). Where y0
holds all the mass (no other finite score) the official redraw returns y0: its mass stays on y0. Sums are in
float64; the result is float32 log-probs, -inf where the probability is 0.
"""
from __future__ import annotations

import torch
from torch import Tensor

# above this many nucleus columns, one device->host read bounds the float32 running-sum loop first
_LOOP_CAP = 32
# on the CPU, compute the redraw terms only for the rows that have a repeat (device code does every row)
CPU_SUBSET = True


def _running_keep(head: Tensor, top_p: Tensor, top_k: Tensor) -> Tensor:
    """(R, K) bool: the official nucleus membership of the sorted head columns."""
    rows, k = head.shape
    cols = torch.arange(k, device=head.device)
    limit = k
    if k > _LOOP_CAP:  # bound the loop by where the (float64) running sum is surely past every row's top_p
        past = head.double().cumsum(1) >= top_p.double()[:, None] + 1e-3  # float32 sum error < k * 6e-8
        past |= cols[None, :] >= top_k[:, None]
        first = torch.where(past.any(1), past.int().argmax(1), torch.full_like(top_k, k))
        limit = min(k, int(first.max()) + 2)  # the one host read
    below = torch.zeros(rows, k, dtype=torch.bool, device=head.device)
    run = torch.zeros(rows, dtype=torch.float32, device=head.device)
    for j in range(limit - 1):  # below[:, j + 1]: the float32 sum of columns 0..j is < top_p
        run = run + head[:, j]
        below[:, j + 1] = run < top_p
    # kept: column 0, then every column while the sums before it stay below top_p (monotone), within top_k
    return (below | (cols == 0)[None, :]).cumprod(1).bool() & (cols[None, :] < top_k[:, None])


def _stable_top(probs: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The first k columns of `probs.sort(descending=True, stable=True)` (values, ids), without sorting the
    whole row: topk finds the k-th value v; the set is every entry above v plus the lowest-index entries
    equal to v, ordered by a stable sort of those k by index then by value."""
    if k >= probs.shape[1]:
        return probs.sort(dim=-1, descending=True, stable=True)
    top_v, top_i = probs.topk(k, dim=-1)
    v = top_v[:, -1:]
    above = (probs > v).sum(1, keepdim=True)  # < k: they are all in topk's columns before the ties
    idx = torch.arange(probs.shape[1], device=probs.device)
    tie_key = torch.where(probs == v, probs.shape[1] - idx, 0)
    ties = tie_key.topk(k, dim=-1).values  # lowest indices first
    col = torch.arange(k, device=probs.device)[None, :]
    pick = probs.shape[1] - ties.gather(1, (col - above).clamp_min(0))
    ids = torch.where(col < above, top_i, pick)  # topk's columns are in descending value order
    ids = ids.sort(dim=1).values  # by index, then stably by value
    vals, order = probs.gather(1, ids).sort(dim=1, descending=True, stable=True)
    return vals, ids.gather(1, order)


def _flushed(e: Tensor, total: Tensor) -> Tensor:
    """e (float64 exp(s - max)) with the entries that float32 `softmax` rounds to 0 set to 0 (e / total at
    0 in float32 arithmetic, as softmax computes it): the official zeros. Entries above keep float64 precision, so
    probabilities below float32's normal range (< 2**-126) are more exact than the official subnormals."""
    return torch.where(e.float() / total.float() == 0, 0.0, e)  # float32 exp, then the float32 division


def ras_logprobs_batch(logits: Tensor, mask_eos: Tensor, top_p: Tensor, top_k: Tensor, window: Tensor,
                       threshold: Tensor, min_len_mask: int, max_top_k: int) -> Tensor:
    """(R, V) float32 log of the exact RAS distribution of each row, on logits' device.

    logits (R, V) raw; mask_eos (R,) bool: mask `min_len_mask` (before min_len); top_p (R,) float32;
    top_k (R,) int64 (>= 1); window (R, W) int64: each row's last win_size outputs in any order, -1 for empty
    slots; threshold (R,) float64: win_size * tau_r (a token is repeated when it occurs >= threshold times
    in the window); max_top_k: the largest top_k of the rows (a host int: no device read)."""
    neg = float("-inf")
    scores = logits.float().log_softmax(dim=-1)
    scores[:, min_len_mask] = torch.where(mask_eos, neg, scores[:, min_len_mask])
    rows, vocab = scores.shape
    k = min(vocab, max_top_k)
    head, hid = _stable_top(scores.softmax(dim=-1), k)
    keep = _running_keep(head, top_p, top_k)
    kept = torch.where(keep, head, 0).double()
    p_n = kept / kept.sum(1, keepdim=True)
    counts = (hid[:, :, None] == window[:, None, :]).sum(-1).double()
    rep = keep & (p_n > 0) & (counts >= threshold[:, None])

    out = torch.full_like(scores, neg)
    out.scatter_(1, hid, p_n.log().float())  # rows without a repeat: the nucleus
    if logits.device.type == "cpu" and CPU_SUBSET:  # no sync to avoid here: work only on the rows with a repeat
        sel = rep.any(1).nonzero().flatten()
        if sel.numel():
            out[sel] = _redrawn(scores[sel], hid[sel], p_n[sel], rep[sel])
    else:
        out = torch.where(rep.any(1, keepdim=True), _redrawn(scores, hid, p_n, rep), out)
    return out


def _redrawn(scores: Tensor, hid: Tensor, p_n: Tensor, rep: Tensor) -> Tensor:
    """log P of rows with repeated nucleus tokens (see the module docstring)."""
    neg = float("-inf")
    top = hid[:, :1]  # y0, the highest score
    s64 = scores.double()
    e = (s64 - s64.gather(1, top)).exp()
    s_top_masked = s64.scatter(1, top, neg)
    m2 = s_top_masked.max(1, keepdim=True).values
    alone = ~torch.isfinite(m2)  # y0 is the only finite score: its redraw gives y0 again
    e2 = (s_top_masked - torch.where(alone, 0.0, m2)).exp()
    s2 = e2.sum(1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    e2 = _flushed(e2, s2)
    rep0 = rep[:, :1] & ~alone
    w0 = torch.where(rep0, p_n[:, :1], 0.0)
    out = w0 * e2 / s2

    rep_rest = rep.clone()
    rep_rest[:, 0] = False
    e_y = e.gather(1, hid)
    # an entry is 0 in every redraw softmax of this family iff it is 0 in the one with the smallest sum
    e = _flushed(e, e.sum(1, keepdim=True) - torch.where(rep_rest, e_y, 0.0).max(1, keepdim=True).values)
    e_y = e.gather(1, hid)
    coef = torch.where(rep_rest, p_n / (e.sum(1, keepdim=True) - e_y), 0.0)  # p_n(y) / (S - e_y)
    out += e * coef.sum(1, keepdim=True)
    own = torch.where(rep_rest, -coef * e_y, p_n)  # a redrawn y gets nothing from its own redraw
    own[:, :1] = torch.where(rep0, 0.0, own[:, :1])  # nor from the nucleus
    out.scatter_add_(1, hid, own)
    return out.clamp_min(0).log().float()


__all__ = ["ras_logprobs_batch"]
