"""CosyVoice's sampling inside vLLM: a v1 logits processor that makes vLLM's plain sampler draw exactly
what `cosy.lm.sampling.ras_sample` draws.

The token ids are the served model family's (`ModelFamily.tokens`): the exported config.json names the
family (`cosy_family`, see `cosy.lm.export`), and the processor reads it from vLLM's hf config. Ids below
are CosyVoice2's.

A request opts in through `SamplingParams.extra_args` (the client sends `extra_body={"vllm_xargs": {...}}`):
    cosy_min_len  int  while fewer tokens than this were produced, logit 6561 (eos only) is -inf. Not
                       vLLM's `min_tokens`, which would mask every stop id (the official sampler lets
                       6562/6563 end the output early).
    cosy_ras      0/1  1: the row becomes log P, P the exact RAS next-token distribution given the request's
                       own outputs (`ras_distribution`), so vLLM must sample it plainly: temperature 1,
                       no top-p/top-k/min-p, no penalties (checked; otherwise HTTP 400).
    cosy_top_p, cosy_top_k, cosy_win, cosy_tau: RAS parameters (default: `SamplingParams`' defaults).
    cosy_ignore_stop 0/1  1: 6561..6563 are -inf at every step (benchmarks with fixed token counts, like
                       the in-process `SamplingParams.ignore_stop`).
    cosy_history  [int]  outputs that precede this request's own (a continued decode: `cosy.lm.bistream` sends
                       one request per segment): the RAS window starts with them (at most 4096 ids).
Requests without cosy_* keys are left untouched. The processor is not argmax-invariant, so vLLM applies it
before greedy argmax too: greedy (temperature 0) requests get the min_len mask.

Each request's history is the live `output_tok_ids` list vLLM hands over in `BatchUpdate.added`. Under
async scheduling (vLLM's default on GPUs) that list holds -1 placeholders unless vLLM knows a custom
processor needs the ids: it knows only for processors named by `--logits-processors`, which is why
`cosy.deploy.backend` loads this class that way instead of through the `vllm.logits_processors` entry point.

`apply` handles the whole batch in one pass on the logits' device (`cosy.lm.ras_batch.ras_logprobs_batch`):
each RAS request's last win_size outputs live in a device ring buffer (`CosyLogitsProcessor.history`, one row
per request slot, so batch moves touch no device memory), fed incrementally with the ids vLLM appended since
the previous step. Per step the host sends one small int64 tensor (the min_len flags and the new ids, pinned
and non-blocking on CUDA) and reads nothing back. `apply_rows` is the former row-by-row loop (`ras_logprobs`),
kept as the reference for tests and `bench/ras_step.py`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor
from vllm import SamplingParams as VllmSamplingParams
from vllm.config import VllmConfig
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from cosy.lm.ras_batch import ras_logprobs_batch
from cosy.lm.sampling import SamplingParams, _nucleus, _repeated, _scores
from cosy.model import families
from cosy.model.family import ModelFamily, SpeechTokens

PREFIX = "cosy_"
KEYS = ("cosy_min_len", "cosy_ras", "cosy_top_p", "cosy_top_k", "cosy_win", "cosy_tau", "cosy_ignore_stop",
        "cosy_history")
MAX_HISTORY = 4096


@dataclass
class CosyRequest:
    """What the processor keeps per batch row."""
    output: list[int]  # vLLM's live list of the request's generated ids
    min_len: int
    ras: SamplingParams | None  # None: only the min_len mask
    ignore_stop: bool = False
    prefix: list[int] = field(default_factory=list)  # cosy_history: outputs before this request's own
    slot: int = -1  # row of CosyLogitsProcessor.history (RAS requests)
    seen: int = field(default=0, repr=False)  # outputs already copied into the history
    fresh: bool = field(default=True, repr=False)  # its history row must be cleared first


def _number(args: dict, key: str, kind: type, default, lo: float, hi: float = float("inf")):
    value = args.get(key, default)
    ok_int = isinstance(value, int) and not isinstance(value, bool)
    if kind is int and not ok_int or kind is float and not (ok_int or isinstance(value, float)):
        raise ValueError(f"vllm_xargs.{key} must be a{'n integer' if kind is int else ' number'}, got {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"vllm_xargs.{key} must lie in [{lo}, {hi}], got {value!r}")
    return kind(value)


def _history(args: dict) -> list[int]:
    value = args.get("cosy_history", [])
    if (not isinstance(value, list) or len(value) > MAX_HISTORY
            or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)):
        raise ValueError(f"vllm_xargs.cosy_history must be a list of at most {MAX_HISTORY} token ids")
    return value


def parse_request(params: VllmSamplingParams) -> tuple[int, SamplingParams | None, bool, list[int]] | None:
    """(min_len, RAS params or None, ignore_stop, history prefix) of a request, None without cosy_* keys;
    ValueError on bad values."""
    args = params.extra_args or {}
    ours = {k: v for k, v in args.items() if isinstance(k, str) and k.startswith(PREFIX)}
    if not ours:
        return None
    if unknown := sorted(set(ours) - set(KEYS)):
        raise ValueError(f"unknown vllm_xargs {unknown}; cosy understands {list(KEYS)}")
    min_len = _number(ours, "cosy_min_len", int, 0, 0)
    for flag in ("cosy_ras", "cosy_ignore_stop"):
        if isinstance(ours.get(flag), bool):  # JSON true/false
            ours[flag] = int(ours[flag])
    ignore_stop = bool(_number(ours, "cosy_ignore_stop", int, 0, 0, 1))
    history = _history(ours)
    if not _number(ours, "cosy_ras", int, 0, 0, 1):
        return min_len, None, ignore_stop, history
    d = SamplingParams()
    ras = SamplingParams(top_p=_number(ours, "cosy_top_p", float, d.top_p, 0.0, 1.0),
                         top_k=_number(ours, "cosy_top_k", int, d.top_k, 1),
                         win_size=_number(ours, "cosy_win", int, d.win_size, 0),
                         tau_r=_number(ours, "cosy_tau", float, d.tau_r, 0.0))
    if ras.top_p <= 0:
        raise ValueError("vllm_xargs.cosy_top_p must be > 0")
    # vLLM samples from our row after this processor; anything that reshapes the row would bias the draw
    plain = (params.temperature == 1.0 and params.top_p == 1.0 and params.top_k in (0, -1)
             and params.min_p == 0.0 and params.presence_penalty == 0.0 and params.frequency_penalty == 0.0
             and params.repetition_penalty == 1.0)
    if not plain:
        raise ValueError("cosy_ras=1 needs plain sampling: temperature 1, top_p 1, top_k -1, min_p 0 and no "
                         "penalties (the RAS distribution already includes top-p/top-k)")
    return min_len, ras, ignore_stop, history


def ras_logprobs(logits: Tensor, history: list[int], p: SamplingParams, mask_eos: bool, *,
                 tokens: SpeechTokens) -> Tensor:
    """log of `cosy.lm.sampling.ras_distribution(logits, history, p, mask_eos, tokens=tokens)`, (V,) float32
    on logits' device; the sum over repeated tokens is one batched softmax and a matrix-vector product, not
    a loop.

    P(x) = p_n(x) [x not in R] + sum_{y in R} p_n(y) p_f^(-y)(x), p_f^(-y) the full softmax without y.
    """
    scores = _scores(logits, mask_eos, tokens)  # float32 log-probs, eos masked before min_len
    kept, ids = (t.to(scores.device) for t in _nucleus(scores.softmax(dim=0), p))  # (_nucleus: on the CPU)
    p_n = kept.double() / kept.double().sum()
    ids_list, w_list = ids.tolist(), p_n.tolist()
    rep = [i for i, t in enumerate(ids_list) if w_list[i] > 0 and _repeated(t, history, p)]
    own = p_n.clone()
    own[rep] = 0.0  # a repeated token keeps no nucleus mass of its own: it is redrawn
    if not rep or int(torch.isfinite(scores).sum()) == 1:  # nothing redrawn, or y is all there is
        out = torch.full_like(scores, float("-inf"))
        out[ids] = (p_n if rep else own).log().float()
        return out
    at = torch.tensor(rep, device=scores.device)
    ys = ids[at]
    masked = scores.expand(len(rep), -1).clone()
    masked[torch.arange(len(rep), device=scores.device), ys] = float("-inf")
    full = masked.softmax(dim=1).double()  # p_f^(-y), one row per repeated y
    weights = p_n[at] / full.sum(dim=1)  # renormalised in float64, as ras_distribution does
    out = weights @ full
    out[ids] += own
    return out.log().float()


def served_family(hf_config) -> ModelFamily:
    """The model family of the served export: its config.json's `cosy_family`, else the family whose
    architecture it declares; ValueError when neither names a known family."""
    name = getattr(hf_config, "cosy_family", None)
    if name is not None:
        try:
            return families.get(name)
        except KeyError as e:
            raise ValueError(e.args[0]) from None
    archs = set(getattr(hf_config, "architectures", None) or ())
    for family in families.families():
        if family.vllm_architecture in archs:
            return family
    raise ValueError(f"the served model ({', '.join(archs) or 'no architecture'}) is not a cosy export: "
                     "serve the directory cosy.lm.export writes")


class CosyLogitsProcessor(LogitsProcessor):
    """min_len eos mask and exact RAS for requests carrying cosy_* extra args; others untouched."""

    @classmethod
    def validate_params(cls, sampling_params: VllmSamplingParams) -> None:
        parse_request(sampling_params)  # ValueError -> HTTP 400 at the server

    def __init__(self, vllm_config: VllmConfig, device: torch.device, is_pin_memory: bool):
        self.requests: dict[int, CosyRequest] = {}  # batch row -> state
        self.tokens = served_family(vllm_config.model_config.hf_config).tokens
        self.device = torch.device(device)
        self.pin = bool(is_pin_memory) and self.device.type == "cuda"
        self.stop = torch.tensor(self.tokens.stop, device=self.device)  # index of the ignore_stop mask
        # ring buffer of each RAS request's last win_size outputs (-1: empty), one row per slot
        self.history = torch.full((8, 1), -1, dtype=torch.int64, device=self.device)
        self._free: list[int] = list(range(8))[::-1]
        self._layout: dict | None = None  # device row indices and parameters, rebuilt when the batch changes

    def is_argmax_invariant(self) -> bool:
        return False  # the eos mask changes greedy picks

    def _new(self, params: VllmSamplingParams, prompt_ids: list[int] | None, output: list[int]) -> CosyRequest | None:
        parsed = parse_request(params)
        if parsed is None:
            return None
        req = CosyRequest(output, *parsed)
        if req.ras is not None:
            if not self._free:  # twice the slots, same ring width
                n = self.history.shape[0]
                self.history = torch.cat([self.history, torch.full_like(self.history, -1)])
                self._free = list(range(2 * n - 1, n - 1, -1))
            req.slot = self._free.pop()
        return req

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is None:
            return
        process_dict_updates(self.requests, batch_update, self._new)
        live = {r.slot for r in self.requests.values() if r.slot >= 0}
        in_use = set(range(self.history.shape[0])) - set(self._free)
        self._free.extend(sorted(in_use - live, reverse=True))
        self._layout = None

    def _build_layout(self) -> dict:
        """Row groups (ignore_stop, min_len only, RAS) and the RAS rows' parameters as device tensors."""
        dev, reqs = self.device, sorted(self.requests.items())
        ras = [(row, r) for row, r in reqs if r.ras is not None]
        plain = [(row, r) for row, r in reqs if r.ras is None and r.min_len > 0]
        width = max([r.ras.win_size for _, r in ras] + [1])
        if width > self.history.shape[1]:  # wider ring: pad (old rows keep their positions < their win)
            pad = torch.full((self.history.shape[0], width - self.history.shape[1]), -1, dtype=torch.int64,
                             device=dev)
            self.history = torch.cat([self.history, pad], dim=1)
        ids = lambda rows: torch.tensor(rows, dtype=torch.int64, device=dev)  # noqa: E731
        return {
            "ignore": ids([row for row, r in reqs if r.ignore_stop]),
            "plain": ids([row for row, _ in plain]), "plain_reqs": [r for _, r in plain],
            "ras": ids([row for row, _ in ras]), "ras_reqs": [r for _, r in ras],
            "slots": ids([r.slot for _, r in ras]),
            "top_p": torch.tensor([r.ras.top_p for _, r in ras], dtype=torch.float32, device=dev),
            "top_k": ids([r.ras.top_k for _, r in ras]),
            "threshold": torch.tensor([r.ras.win_size * r.ras.tau_r for _, r in ras], dtype=torch.float64,
                                      device=dev),
            "max_top_k": max([r.ras.top_k for _, r in ras] + [1]),
        }

    def _send(self, lay: dict) -> tuple[Tensor, Tensor]:
        """The step's host data in one copy: min_len flags of the plain and RAS rows, then the history
        updates (slots to clear, then slot, position, id of each new output). Returns (plain flags, RAS
        flags) on the device, the history updated."""
        plain, ras = lay["plain_reqs"], lay["ras_reqs"]
        flags = [len(r.output) < r.min_len for r in plain] + [len(r.output) < r.min_len for r in ras]
        clear, slots, pos, toks = [], [], [], []
        for r in ras:
            k = len(r.prefix)  # the history is prefix + output, positions counted over both
            n, win = k + len(r.output), r.ras.win_size
            if r.fresh or n < r.seen:  # new slot, or vLLM rewrote the list: rebuild the row
                clear.append(r.slot)
                r.fresh, r.seen = False, 0
            for i in range(max(r.seen, n - win), n) if win > 0 else ():
                slots.append(r.slot)
                pos.append(i % win)
                toks.append(r.prefix[i] if i < k else r.output[i - k])
            r.seen = n
        host = torch.tensor(flags + clear + slots + pos + toks, dtype=torch.int64)
        data = host.pin_memory().to(self.device, non_blocking=True) if self.pin else host.to(self.device)
        f, c, m = len(flags), len(clear), len(slots)
        if c:
            self.history[data[f:f + c]] = -1
        if m:
            at = f + c
            self.history[data[at:at + m], data[at + m:at + 2 * m]] = data[at + 2 * m:at + 3 * m]
        return data[:len(plain)].bool(), data[len(plain):f].bool()

    def apply(self, logits: Tensor) -> Tensor:
        if not self.requests:
            return logits
        if self._layout is None:
            self._layout = self._build_layout()
        lay = self._layout
        plain_eos, ras_eos = self._send(lay)
        neg = float("-inf")
        if lay["ignore"].numel():
            logits[lay["ignore"][:, None], self.stop[None, :]] = neg
        m = self.tokens.min_len_mask
        if lay["plain"].numel():
            rows = lay["plain"]
            logits[rows, m] = torch.where(plain_eos, neg, logits[rows, m])
        if lay["ras"].numel():
            rows = lay["ras"]
            out = ras_logprobs_batch(logits[rows], ras_eos, lay["top_p"], lay["top_k"], self.history[lay["slots"]],
                                     lay["threshold"], m, lay["max_top_k"])
            logits[rows] = out.to(logits.dtype)
        return logits

    def apply_rows(self, logits: Tensor) -> Tensor:
        """The former row-by-row `apply` (host syncs per row): the reference of tests and benchmarks."""
        for row, req in self.requests.items():
            if req.ignore_stop:
                logits[row, self.stop] = float("-inf")
            mask_eos = len(req.output) < req.min_len
            if req.ras is not None:
                logits[row] = ras_logprobs(logits[row], req.prefix + list(req.output), req.ras, mask_eos,
                                           tokens=self.tokens)
            elif mask_eos:
                logits[row, self.tokens.min_len_mask] = float("-inf")
        return logits


__all__ = ["CosyLogitsProcessor", "CosyRequest", "KEYS", "parse_request", "ras_logprobs", "served_family"]
