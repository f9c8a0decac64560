"""Write random-weight model directories in the official layout of a model family (tiny or full size).

No weights can be downloaded where our tests run, so tests and benchmarks use directories that this
builder writes: the official yaml structure, the official state-dict keys and formats (CosyVoice2's hift.pt
with legacy weight-norm names, like the published file), ONNX stand-ins with the official signatures, and
`CosyVoice-BlankEN/` with the real Qwen BPE files, all with seeded random values.

Per family, `WRITERS` holds the writer `(out_dir, size, seed, atomic_write)`: CosyVoice2's is
`write_cosyvoice2`; CosyVoice3's writes its LM half (`cosyvoice3_lm`: yaml, llm.pt, tokenizer, ONNX) and then
its flow and vocoder (`cosyvoice3_speech.write_flow_hift`, from the yaml just written) where that module is.
"""
from __future__ import annotations

import importlib
import os
from importlib import resources
from pathlib import Path

import torch

from cosy.hift.generator import HiFTGenerator
from cosy.hift.weights import unfold_weight_norm, weight_normed_keys
from cosy.model.config import read_model_config
from cosy.model.families.cosyvoice2 import FAMILY
from cosy.model.families.cosyvoice3 import FAMILY as COSYVOICE3
from cosy.model.family import import_object
from cosy.verify.random_model import aligner, cosyvoice3_lm
from cosy.verify.random_model.llm import write_llm_pt
from cosy.verify.random_model.onnx_models import write_campplus_onnx, write_speech_tokenizer_onnx
from cosy.verify.random_model.sizes import SIZES
from cosy.verify.random_model.tokenizer_dir import write_tokenizer_dir

__all__ = ["write_random_model", "SIZES", "FAMILY_SIZES", "WRITERS"]

FAMILY_SIZES = {"cosyvoice2": SIZES, "cosyvoice3": cosyvoice3_lm.SIZES, "mms-aligner": aligner.SIZES}


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    write(tmp)
    os.replace(tmp, path)


def _save(state_dict: dict[str, torch.Tensor], path: Path) -> None:
    _atomic_write(path, lambda p: torch.save({k: v.contiguous() for k, v in state_dict.items()}, p))


def _voiced_f0(hift: HiFTGenerator) -> None:
    """Make the random F0 predictor say 'voiced, about 100-300 Hz' so the sine source is exercised.

    As initialised it predicts |f0| of a few Hz: every frame unvoiced, the source a constant.
    """
    clf = hift.f0_predictor.classifier
    clf.weight.mul_(40.0)
    clf.bias.fill_(180.0)


def write_random_model(out_dir: str | Path, size: str = "tiny", seed: int = 0, family: str = "cosyvoice2") -> Path:
    """Write a complete model directory of `family` for `size` into `out_dir` (created). Returns the path.

    The same family, size and seed always give the same files. The caller's RNG state is left untouched.
    """
    if family not in WRITERS:
        raise ValueError(f"unknown model family '{family}' (choose from {', '.join(WRITERS)})")
    if size not in FAMILY_SIZES[family]:
        raise ValueError(f"unknown size '{size}' (choose from {', '.join(FAMILY_SIZES[family])})")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    WRITERS[family](out, size, seed, _atomic_write)
    return out


def write_cosyvoice2(out: Path, size: str, seed: int, atomic_write) -> None:
    """The whole CosyVoice2 directory."""
    template = resources.files(__package__).joinpath("cosyvoice2.yaml.template").read_text(encoding="utf-8")
    dims = SIZES[size]
    yaml_text = template.format(**vars(dims))
    files = FAMILY.files  # a CosyVoice2 directory: the template and the writers are CosyVoice2's
    atomic_write(out / files.yaml, lambda p: p.write_text(yaml_text, encoding="utf-8"))
    cfg = read_model_config(out / files.yaml, FAMILY)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        flow = import_object(FAMILY.flow)(cfg.flow, import_object(FAMILY.flow_estimator))
        _save(flow.state_dict(), out / files.flow)
        hift = import_object(FAMILY.hift)(cfg.hift)
        _voiced_f0(hift)
        _save(unfold_weight_norm(hift.state_dict(), weight_normed_keys(hift), legacy=True), out / files.hift)
    llm_dims = (dims.llm_size, dims.llm_layers, dims.llm_heads, dims.llm_kv_heads, dims.llm_intermediate)
    write_llm_pt(out / files.llm, *llm_dims, seed=seed)
    write_tokenizer_dir(out / files.qwen_dir, *llm_dims)
    write_speech_tokenizer_onnx(out / files.speech_tokenizer, seed=seed)
    write_campplus_onnx(out / files.campplus, seed=seed)


def write_cosyvoice3(out: Path, size: str, seed: int, atomic_write) -> None:
    """The LM half, then flow.pt and hift.pt from the yaml it wrote (skipped where the speech module is absent)."""
    cosyvoice3_lm.write(out, size, seed, atomic_write)
    name = f"{__name__}.cosyvoice3_speech"
    try:
        speech = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name != name:
            raise
        return
    speech.write_flow_hift(out, read_model_config(out / COSYVOICE3.files.yaml, COSYVOICE3), seed)


# mms-aligner: not a TTS family, the forced aligner `--aligner` loads (cosy.align)
WRITERS = {"cosyvoice2": write_cosyvoice2, "cosyvoice3": write_cosyvoice3, "mms-aligner": aligner.write}
