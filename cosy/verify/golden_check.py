"""Check our code against a directory of official outputs (the golden format).

    python -m cosy.golden_check GOLDEN_DIR [--kinds flow,hift,audio,text,lm]

GOLDEN_DIR holds `model/` (an official model directory), `cases.json` (what each case called, with which
inputs, and its tolerance), `cases.safetensors` (input and output tensors) and, for text cases,
`tokenizer/`. Every case is recomputed with our code and compared; one line per output: name, max-abs
difference (or count of mismatches for exact outputs), tolerance, PASS/FAIL. Exit status 1 when a
selected case fails or is not understood.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors.torch import load_file
from torch import Tensor

from cosy.verify.golden_cases import GoldenModels, handler_for

Row = tuple[str, float, float, bool]  # label, difference, tolerance, passed


# an output without a tolerance entry of its own takes that of the quantity it holds
TOLERANCE_OF = {"chunks": "speech"}


def _tolerance(case: dict, output: str) -> float:
    tol = case.get("suggested_tolerance", {})
    if output not in tol and "atol" not in tol and TOLERANCE_OF.get(output) in tol:
        output = TOLERANCE_OF[output]
    if isinstance(tol.get(output), dict):
        tol = tol[output]
    elif isinstance(tol.get(output), str):  # e.g. "atol 1e-6 (pure table lookups)"
        m = re.search(r"atol\s+([0-9.eE+-]+)", tol[output])
        if m:
            return float(m.group(1))
    if tol.get("exact"):
        return 0.0
    if "atol" not in tol:
        raise KeyError(f"no atol for output '{output}'")
    return float(tol["atol"])


def _max_diff(mine: Tensor, ref: Tensor) -> float:
    if mine.shape != ref.shape:
        return float("inf")
    return (mine.double() - ref.double()).abs().max().item() if ref.numel() else 0.0


def _compare_tensor(label: str, mine: Tensor, spec: dict, tensors: dict[str, Tensor], tol: float) -> Iterator[Row]:
    mine = mine.detach().float().cpu()
    if "tensor" in spec:
        diff = _max_diff(mine, tensors[spec["tensor"]])
        yield label, diff, tol, diff <= tol
        return
    # a large tensor stored as windows plus float64 checksums of the whole
    if list(mine.shape) != list(spec.get("full_shape", spec.get("shape"))):
        yield f"{label} shape {tuple(mine.shape)}", float("inf"), tol, False
        return
    for name, w in spec["windows"].items():
        lo, hi = w["range"]
        ref = tensors[w["tensor"]]
        axes = [i for i, (a, b) in enumerate(zip(mine.shape, ref.shape)) if a != b]
        part = mine.narrow(axes[0], lo, hi - lo) if len(axes) == 1 else mine  # the window's axis
        diff = _max_diff(part, ref)
        yield f"{label}[{name}]", diff, tol, diff <= tol
    # each checksum may move by what `tol` per element allows
    x = mine.double()
    n, s_abs = x.numel(), x.abs().sum().item()
    sums = spec["checksum_float64"]
    bounds = {"sum": (x.sum().item(), tol * n), "sum_abs": (s_abs, tol * n),
              "sum_sq": ((x * x).sum().item(), 2 * tol * s_abs + tol * tol * n),
              "min": (x.min().item(), tol), "max": (x.max().item(), tol)}
    worst = max(abs(v - sums[k]) / max(b, 1e-30) for k, (v, b) in bounds.items() if k in sums)
    yield f"{label}[checksums]", worst * tol, tol, worst <= 1.0


def _compare(case: dict, ours: dict[str, Any], tensors: dict[str, Tensor]) -> Iterator[Row]:
    name = case["name"]
    single = len(case.get("outputs", {})) == 1
    for out, spec in case.get("outputs", {}).items():
        if isinstance(spec, str) and spec.startswith(("see ", "extra.")):
            continue  # described in `extra`: the handler returns (ours, expected) pairs for it
        if out not in ours:
            yield f"{name}.{out} (not computed)", float("inf"), 0.0, False
            continue
        label = name if single else f"{name}.{out}"
        mine = ours.pop(out)
        if isinstance(spec, dict):
            yield from _compare_tensor(label, mine, spec, tensors, _tolerance(case, out))
        elif isinstance(spec, list) and spec and all(isinstance(s, dict) and "tensor" in s for s in spec):
            # a list of tensors (e.g. streamed chunks): compared one by one, and their number
            if len(mine) != len(spec):
                yield f"{label} ({len(mine)} items, expected {len(spec)})", float("inf"), 0.0, False
                continue
            for i, (m, s) in enumerate(zip(mine, spec)):
                yield from _compare_tensor(f"{label}[{i}]", m, s, tensors, _tolerance(case, out))
        else:
            yield label, 0.0 if mine == spec else float("inf"), 0.0, mine == spec
    # (ours, expected) pairs for exact outputs kept outside the tensors (text, tokenizer)
    pairs = {k: v for k, v in ours.items() if isinstance(v, tuple) and len(v) == 2}
    if pairs:
        bad = [k for k, (mine, ref) in pairs.items() if mine != ref]
        yield f"{name} ({len(pairs) - len(bad)}/{len(pairs)} exact)", float(len(bad)), 0.0, not bad
        for k in bad[:10]:
            mine, ref = pairs[k]
            print(f"    {name}{k}: ours {mine!r} != official {ref!r}")


def run(root: Path, kinds: set[str] | None = None, out=sys.stdout) -> bool:
    """Check every case of `root` (of `kinds` only, when given). True when all checked cases pass."""
    meta = json.loads((root / "cases.json").read_text(encoding="utf-8"))
    tensor_file = root / "cases.safetensors"  # a directory of literal cases only (golden-bistream) has none
    tensors = load_file(tensor_file) if tensor_file.exists() else {}
    models = GoldenModels(root, tensors, meta.get("extra", {}), model_dir=root / meta.get("model_dir", "model"))
    ok = True
    for case in meta["cases"]:
        if kinds is not None and case["name"].split(".", 1)[0] not in kinds:
            continue
        handler = handler_for(case, models.family, default_producer=meta.get("format", ""))
        if handler is None:
            rows: list[Row] = [(f"{case['name']} (case not understood)", float("inf"), 0.0, False)]
        else:
            try:
                with torch.inference_mode():
                    rows = list(_compare(case, handler(models, case), tensors))
            except Exception as e:  # a broken case is a failure to report, not a crash
                rows = [(f"{case['name']} error: {type(e).__name__}: {e}", float("inf"), 0.0, False)]
        for label, diff, tol, passed in rows:
            print(f"{label:<60} {diff:>10.3g} {tol:>8.1g}  {'PASS' if passed else 'FAIL'}", file=out)
            ok &= passed
    return ok


def build_parser() -> argparse.ArgumentParser:
    """The checker's flags (the docs' flags reference is generated from this parser)."""
    parser = argparse.ArgumentParser(prog="python -m cosy.golden_check", description=__doc__.split("\n")[0])
    parser.add_argument("golden_dir", type=Path, help="a golden-format directory (model/, cases.json, ...)")
    parser.add_argument("--kinds", help="comma-separated case kinds to check (name prefixes: flow,hift,...)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    kinds = set(args.kinds.split(",")) if args.kinds else None
    print(f"{'case':<60} {'max|diff|':>10} {'atol':>8}  result")
    return 0 if run(args.golden_dir, kinds) else 1


if __name__ == "__main__":
    sys.exit(main())
