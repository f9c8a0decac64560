"""HiFT checkpoint key handling: weight-norm folding and the two weight-norm naming styles.

Official checkpoints store each weight-normed conv as a magnitude g and a direction v, under either the
legacy names `X.weight_g` / `X.weight_v` (`torch.nn.utils.weight_norm`, as in the published hift.pt) or
the parametrization names `X.parametrizations.weight.original0` / `original1`. Our modules are plain convs,
so at load w = g * v / ||v|| (norm over all dims but 0, as `weight_norm(dim=0)`) becomes `X.weight`.
A `generator.` prefix (HiFiGan training wrapper) is stripped.
"""
from __future__ import annotations

import torch
from torch import nn

LEGACY = ("weight_g", "weight_v")
PARAMETRIZATION = ("parametrizations.weight.original0", "parametrizations.weight.original1")
PREFIX = "generator."


def strip_prefix(sd: dict[str, torch.Tensor], prefix: str = PREFIX) -> dict[str, torch.Tensor]:
    """Drop `prefix` from the keys that carry it."""
    return {k.removeprefix(prefix): v for k, v in sd.items()}


def _split(key: str) -> tuple[str, int] | None:
    """`conv.weight_g` -> ('conv', 0); `conv.parametrizations.weight.original1` -> ('conv', 1); else None."""
    for names in (LEGACY, PARAMETRIZATION):
        for i, name in enumerate(names):
            if key.endswith("." + name):
                return key[: -len(name) - 1], i
    return None


def fold_weight_norm(sd: dict[str, torch.Tensor], float64_prefixes: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """Checkpoint state dict (either naming style, optional `generator.` prefix) -> plain `X.weight` keys.

    Uses `torch._weight_norm`, the op the official modules run at every forward, so the folded weights are
    bit-identical to what the official model computes. Tensors under `float64_prefixes` (a submodule the
    official casts to float64 before use: CosyVoice3's f0 predictor) are folded and returned in float64.
    """
    out: dict[str, torch.Tensor] = {}
    pairs: dict[str, list[torch.Tensor | None]] = {}
    for key, value in strip_prefix(sd).items():
        split = _split(key)
        if split is None:
            out[key] = value
            continue
        base, i = split
        if base not in pairs:
            pairs[base] = [None, None]
            out[base + ".weight"] = value  # placeholder keeps the key order
        if pairs[base][i] is not None:
            raise ValueError(f"weight norm of {base!r} given twice")
        pairs[base][i] = value
    for base, (g, v) in pairs.items():
        if g is None or v is None:
            raise ValueError(f"weight norm of {base!r} lacks its {'g' if g is None else 'v'} tensor")
        if base.startswith(float64_prefixes):
            out[base + ".weight"] = torch._weight_norm(v.double(), g.double(), 0)
        else:
            out[base + ".weight"] = torch._weight_norm(v.float(), g.float(), 0).to(v.dtype)
    if float64_prefixes:
        out = {k: v.double() if k.startswith(float64_prefixes) else v for k, v in out.items()}
    return out


def _rename(sd: dict[str, torch.Tensor], src: tuple[str, str], dst: tuple[str, str]) -> dict[str, torch.Tensor]:
    out = {}
    for key, value in sd.items():
        for a, b in zip(src, dst):
            if key.endswith("." + a):
                key = key[: -len(a)] + b
                break
        out[key] = value
    return out


def to_parametrization_names(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`X.weight_g` / `X.weight_v` -> `X.parametrizations.weight.original0` / `original1`."""
    return _rename(sd, LEGACY, PARAMETRIZATION)


def to_legacy_names(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`X.parametrizations.weight.original0` / `original1` -> `X.weight_g` / `X.weight_v`."""
    return _rename(sd, PARAMETRIZATION, LEGACY)


def weight_normed_keys(model: nn.Module) -> list[str]:
    """The `X.weight` keys of `model` (a HiFTGenerator) that the official layout stores weight-normed.

    All convs are, except `source_downs.*`; Linear layers (`l_linear`, `classifier`) are not.
    """
    keys = []
    for name, module in model.named_modules():
        if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)) and not name.startswith("source_downs."):
            keys.append(name + ".weight")
    return keys


def unfold_weight_norm(
    sd: dict[str, torch.Tensor], keys: list[str], legacy: bool = True
) -> dict[str, torch.Tensor]:
    """Plain state dict -> official layout: each of `keys` becomes g = ||w|| (dims > 0) and v = w.

    Names are legacy (`weight_g`/`weight_v`, like the published hift.pt) or parametrization style. Order:
    the module's other tensors (bias) first, then g, v, as the official modules list them.
    """
    names = LEGACY if legacy else PARAMETRIZATION
    missing = [k for k in keys if k not in sd]
    if missing:
        raise KeyError(f"not in the state dict: {missing}")
    normed = set(keys)
    gv = {k.removesuffix(".weight"): sd[k] for k in keys}
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        base = key.rsplit(".", 1)[0]
        if key in normed:
            if base + ".bias" not in sd:  # no bias to follow: g, v take the weight's place
                _put_gv(out, base, value, names)
            continue
        out[key] = value
        if base in gv and key == base + ".bias":
            _put_gv(out, base, gv[base], names)
    return out


def _put_gv(out: dict[str, torch.Tensor], base: str, w: torch.Tensor, names: tuple[str, str]) -> None:
    out[f"{base}.{names[0]}"] = torch.norm_except_dim(w, 2, 0)
    out[f"{base}.{names[1]}"] = w
