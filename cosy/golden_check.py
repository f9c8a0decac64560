"""Check our code against a directory of official outputs (the golden format).

    python -m cosy.golden_check GOLDEN_DIR [--kinds flow,hift]

GOLDEN_DIR holds `model/` (an official model directory), `cases.json` (what each case called, with which
inputs, and its tolerance) and `cases.safetensors` (input and output tensors). Every case is recomputed
with our modules from `model/` and compared; one line per case: name, max-abs difference, tolerance,
PASS/FAIL. Exit status 1 when a selected case fails or is not understood.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file
from torch import Tensor

from cosy.load import load_flow, load_hift
from cosy.model_dir import ModelDir


@dataclass
class Golden:
    """One golden directory: its cases, tensors and model (loaded on first use)."""

    root: Path
    cases: list[dict] = field(init=False)
    tensors: dict[str, Tensor] = field(init=False)

    def __post_init__(self) -> None:
        meta = json.loads((self.root / "cases.json").read_text(encoding="utf-8"))
        self.cases = meta["cases"]
        self.tensors = load_file(self.root / "cases.safetensors")

    @cached_property
    def model(self) -> ModelDir:
        return ModelDir(self.root / "model")

    @cached_property
    def flow(self):
        return load_flow(self.model)

    @cached_property
    def hift(self):
        return load_hift(self.model)

    def tensor(self, spec: object) -> Tensor:
        """An input given as {"tensor": name}, as "name", or as "name[:, :N]"-style slice text."""
        if isinstance(spec, dict):
            return self.tensors[spec["tensor"]]
        m = re.fullmatch(r"\s*([\w.]+)\s*(\[.*\])?\s*", str(spec))
        if not m or m.group(1) not in self.tensors:
            raise KeyError(f"input '{spec}' names no tensor")
        t = self.tensors[m.group(1)]
        if m.group(2):
            index = []
            for part in m.group(2)[1:-1].split(","):
                bounds = [int(b) if b.strip() else None for b in part.split(":")]
                index.append(slice(*bounds) if len(bounds) > 1 else bounds[0])
            t = t[tuple(index)]
        return t


# A handler recomputes one kind of case: it returns our value for each output name.
Handler = Callable[[Golden, dict], dict[str, Tensor]]


def _flow(g: Golden, case: dict) -> dict[str, Tensor]:
    inp, args = case["inputs"], case["args"]
    mel = g.flow.inference(g.tensor(inp["token"]), g.tensor(inp["prompt_token"]), g.tensor(inp["prompt_feat"]),
                           g.tensor(inp["embedding"]), streaming=bool(args["streaming"]),
                           finalize=bool(args["finalize"]))
    return {"mel": mel}


def _hift_f0(g: Golden, case: dict) -> dict[str, Tensor]:
    with torch.inference_mode():
        return {"f0": g.hift.predict_f0(g.tensor(case["inputs"]["speech_feat"]))}


def _hift_zero_noise(g: Golden, case: dict) -> dict[str, Tensor]:
    with torch.inference_mode():
        speech, source = g.hift.inference(g.tensor(case["inputs"]["speech_feat"]), noise=False)
    return {"source": source, "speech": speech}


def _hift_decode(g: Golden, case: dict) -> dict[str, Tensor]:
    inp = case["inputs"]
    with torch.inference_mode():
        return {"speech": g.hift.decode(g.tensor(inp["x"]), g.tensor(inp["s"]))}


# (kind, test on the case's `producer` text, handler); the first match wins.
HANDLERS: list[tuple[str, Callable[[str], bool], Handler]] = [
    ("flow", lambda p: "CausalMaskedDiffWithXvec.inference" in p, _flow),
    ("hift", lambda p: "f0_predictor" in p and "inference" not in p, _hift_f0),
    ("hift", lambda p: "HiFTGenerator.inference" in p and "zeros" in p, _hift_zero_noise),
    ("hift", lambda p: "HiFTGenerator.decode" in p, _hift_decode),
]


def _tolerance(case: dict, output: str) -> float:
    tol = case.get("suggested_tolerance", {})
    if isinstance(tol.get(output), dict):
        tol = tol[output]
    if "atol" not in tol:
        raise KeyError(f"no atol for output '{output}'")
    return float(tol["atol"])


def check_case(g: Golden, case: dict, handler: Handler) -> list[tuple[str, float, float, bool]]:
    """Rows (label, max-abs diff, atol, passed) for every tensor output of `case`."""
    ours = handler(g, case)
    rows = []
    for name, spec in case["outputs"].items():
        if not isinstance(spec, dict) or "tensor" not in spec:
            continue  # literal outputs (lengths) are checked through the tensors' shapes
        ref = g.tensors[spec["tensor"]]
        mine = ours[name].detach().float().cpu()
        tol = _tolerance(case, name)
        label = case["name"] if len(case["outputs"]) == 1 else f"{case['name']}.{name}"
        if mine.shape != ref.shape:
            rows.append((f"{label} shape {tuple(mine.shape)} != {tuple(ref.shape)}", float("inf"), tol, False))
            continue
        diff = (mine - ref.float()).abs().max().item() if ref.numel() else 0.0
        rows.append((label, diff, tol, diff <= tol))
    return rows


def run(root: Path, kinds: set[str] | None = None, out=sys.stdout) -> bool:
    """Check every case of `root` (of `kinds` only, when given). True when all checked cases pass."""
    g = Golden(root)
    ok = True
    for case in g.cases:
        kind = case["name"].split(".", 1)[0]
        if kinds is not None and kind not in kinds:
            continue
        match = next((h for k, test, h in HANDLERS if test(case.get("producer", ""))), None)
        if match is None:
            print(f"{case['name']:<48} {'-':>10} {'-':>8}  FAIL (case not understood)", file=out)
            ok = False
            continue
        try:
            rows = check_case(g, case, match)
        except Exception as e:  # a broken case is a failure to report, not a crash
            rows = [(f"{case['name']} error: {type(e).__name__}: {e}", float("inf"), 0.0, False)]
        for label, diff, tol, passed in rows:
            print(f"{label:<48} {diff:>10.3g} {tol:>8.1g}  {'PASS' if passed else 'FAIL'}", file=out)
            ok &= passed
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cosy.golden_check", description=__doc__.split("\n")[0])
    parser.add_argument("golden_dir", type=Path)
    parser.add_argument("--kinds", help="comma-separated case kinds to check (name prefixes: flow,hift,...)")
    args = parser.parse_args(argv)
    kinds = set(args.kinds.split(",")) if args.kinds else None
    print(f"{'case':<48} {'max|diff|':>10} {'atol':>8}  result")
    return 0 if run(args.golden_dir, kinds) else 1


if __name__ == "__main__":
    sys.exit(main())
