"""Official bistream LM decodes, run through our decoding (`cosy.lm.bistream.decode` on the embedded LM).

Two golden formats: golden-cv3's `lm.bistream` case (`inference_bistream`, teacher forced; below) and the
CosyVoice2 `golden-bistream` directory (greedy decodes of fixed text pieces; `official_bistream_case`, which
tests/test_bistream.py also uses on the vLLM backend).

Our decoding feeds the same positions as the official but not in the same forward calls: after a forced fill
the official runs one forward on the last speech token and throws its output away, where ours feeds that token
with the next block. The official step list is rebuilt from what our backend was fed (a block that starts
with such a pending speech token is split off as the official's unsampled step), and every step's log-probs
and hidden state are recomputed through one KV cache in the official order.
"""
from __future__ import annotations

import re
from typing import Any

import torch

from cosy.lm.bistream import BistreamError, Segment, decode
from cosy.lm.bistream_steps import EmbeddedSteps
from cosy.model.family import ModelFamily
from cosy.verify.golden_cases import GoldenModels


class _Recorder:
    """A step backend that remembers each run's block and the tokens it generated."""

    def __init__(self, inner):
        self.inner, self.runs = inner, []

    def run(self, block, history, max_new, mask_eos, stop):
        generated: list[int] = []
        self.runs.append((list(block), generated))
        for token in self.inner.run(block, history, max_new, mask_eos, stop):
            generated.append(token)
            yield token


def _official_steps(runs) -> list[tuple[list[Segment], bool]]:
    """(input segments, sampled) of every official forward, in order."""
    steps = []
    for block, generated in runs:
        if len(block) > 1 and block[0].kind == "speech" and not block[0].refeed:  # the forced fill's forward
            steps.append(([block[0]], False))
            block = block[1:]
        steps.append((block, True))
        steps += [([Segment("speech", (t,))], True) for t in generated[:-1]]  # each token fed before the next
    return steps


def _name(spec: str) -> str:
    return re.match(r"\s*([\w.]+(\[[^\]]*\])?)", spec).group(1)


def bistream_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    inp = case["inputs"]
    text = g.tensor(_name(inp["text"])).flatten().tolist()  # fed one token at a time
    continuation = iter(g.tensor(_name(inp["continuation"])).flatten().tolist())
    cap = len(case["outputs"]["yielded_tokens"])  # the fixture stopped after this many yielded tokens
    steps = _Recorder(EmbeddedSteps(g.lm, sampler=lambda logits, history, mask_eos: int(next(continuation))))
    yielded = []
    for token in decode([[t] for t in text], g.tensor(inp["prompt_text"]).flatten().tolist(),
                        g.tensor(inp["prompt_speech_token"]).flatten().tolist(), steps, g.family):
        yielded.append(token)
        if len(yielded) == cap:
            break
    official = _official_steps(steps.runs)
    embeds = [g.lm.segments(segs) for segs, _ in official]
    total = sum(e.size(1) for e in embeds)
    cache, rope = g.lm._start(embeds[0], total - embeds[0].size(1))
    logp, hidden, records, fed = [], [], [], 0
    with torch.inference_mode():
        for (segs, sampled), e in zip(official, embeds):
            logits, h = g.lm._step(e, cache, rope)
            logp.append(logits.log_softmax(-1))
            hidden.append(h.float())
            records.append({"in_len": e.size(1), "cache_len": fed, "sampled": sampled,
                            "input_has_task_id": any(s.kind == "task_id" for s in segs)})
            fed += e.size(1)
    return {"yielded_tokens": yielded, "steps": records, "logp": torch.stack(logp), "last_hidden": torch.stack(hidden),
            "step0_input": embeds[0], "inputs_concat": torch.cat(embeds, dim=1)[0]}


class Recording:
    """A StepBackend wrapper that records every fed position as (kind, id, refeed), the backend contract:
    each block, then each generated token but the last of a run."""

    def __init__(self, inner):
        self.inner, self.positions, self.runs = inner, [], 0

    def run(self, block, history, max_new, mask_eos, stop):
        self.runs += 1
        self.positions += positions(block)
        got = []
        for token in self.inner.run(block, history, max_new, mask_eos, stop):
            if got:
                self.positions.append(("speech", got[-1], False))
            got.append(token)
            yield token


def positions(segments) -> list[tuple]:
    """(kind, id, refeed) per fed position of Segments (ours) or the fixture's segment dicts."""
    out = []
    for s in segments:
        kind, ids, refeed = (s.kind, s.ids, s.refeed) if isinstance(s, Segment) else \
            (s["kind"], s.get("ids", ()), bool(s.get("refeed")))
        out += [(kind, None, refeed)] if kind in ("sos", "task_id") else [(kind, i, refeed) for i in ids]
    return out


def run_case(case: dict, steps, family: ModelFamily | None = None) -> dict:
    """Decode a golden-bistream case with `steps` (a StepBackend): yielded, out_tokens, end, fed positions."""
    family = family or _cv2()
    b = case["bistream"]
    rec, out, yielded, end = Recording(steps), [], [], "cap"
    try:
        for token in decode(case["text_pieces"], case["prompt_text"], case["prompt_speech_token"], rec, family,
                            max_final=b["final_cap"], out_tokens=out):
            yielded.append(token)
    except BistreamError as e:
        end = f"ValueError: {e.official}"
    if end == "cap" and out and out[-1] == family.tokens.eos:
        end = "eos"
    return {"yielded": yielded, "out_tokens": out, "end": end, "positions": rec.positions}


def want_of(case: dict) -> dict:
    """The official side of `run_case`."""
    b = case["bistream"]
    end = b["end"] if b["end"] != "ValueError" else f"ValueError: {b['error']}"
    fed = [p for s in b["steps"] for p in positions(s["input"])]
    return {"yielded": b["yielded"], "out_tokens": b["out_tokens"], "end": end, "positions": fed}


def sampled_logps(case: dict) -> list[float]:
    """The official log-probs of the sampled (not forced) steps."""
    return [s["logp"] for s in case["bistream"]["steps"] if not s["forced"]]



def greedy_sampler(overrides: dict[str, int], sampled: list[int], eos: int = 6561):
    """The fixture's sampler: argmax (eos masked when asked), scripted overrides by out_tokens length; records
    the out_tokens length of every draw in `sampled`."""
    def sample(logits, history, mask_eos):
        sampled.append(len(history))
        if str(len(history)) in overrides:
            return int(overrides[str(len(history))])
        scores = logits.float().log_softmax(-1)
        if mask_eos:
            scores[eos] = float("-inf")
        return int(scores.argmax())
    return sample


def _cv2() -> ModelFamily:
    from cosy.model.families.cosyvoice2 import FAMILY
    return FAMILY


TOL = 1e-4  # the fixture README's log-prob tolerance


def official_bistream_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    """A golden-bistream case on the embedded LM: (ours, official) pairs, all exact, the log-prob check included."""
    sampled: list[int] = []
    steps = EmbeddedSteps(g.lm, sampler=greedy_sampler(case.get("sampling_overrides", {}), sampled,
                                                       g.family.tokens.eos), capacity=16, record_logps=True)
    got, want = run_case(case, steps, g.family), want_of(case)
    forced = [i for i, t in enumerate(got["out_tokens"]) if i not in set(sampled)]
    logps = sampled_logps(case)
    worst = max((abs(a - b) for a, b in zip(steps.logps, logps)), default=0.0)
    out = {f".{k}": (got[k], want[k]) for k in got}
    out[".forced_steps"] = (forced, case["bistream"]["forced_steps"])
    out[f".logp_chosen within {TOL:g}"] = (len(steps.logps) == len(logps) and worst < TOL, True)
    return out


HANDLERS = [(lambda p: p.startswith("CosyVoice3LM.inference_bistream"), bistream_case),
            (lambda p: p.startswith("cosyvoice2 bistream golden"), official_bistream_case)]
