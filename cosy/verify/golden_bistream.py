"""The official bistream LM case of a golden directory (golden-cv3 `lm.bistream`: `inference_bistream`, teacher
forced), run through our decoding (`cosy.lm.bistream.decode` on the embedded LM).

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

from cosy.lm.bistream import Segment, decode
from cosy.lm.bistream_steps import EmbeddedSteps
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


HANDLERS = [(lambda p: p.startswith("CosyVoice3LM.inference_bistream"), bistream_case)]
