"""The speech half of a random CosyVoice3 directory: cosyvoice3.yaml, flow.pt and hift.pt in the official format.

flow.pt: the `CausalMaskedDiffWithDiT` state dict (dense, `decoder.estimator.rotary_embed.inv_freq`
included). hift.pt: the `CausalHiFTGenerator` state dict with weight-norm parametrization names
(`...parametrizations.weight.original0/1`), like the published file, all float32 (the official f0
predictor is float64 only at run time). `full` has the published shapes (`cosyvoice3-state-dict.txt`),
`tiny` the golden fixtures' sizes. The LM, tokenizer and ONNX files are written by the family's other
builders (`cosy.verify.random_model`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from cosy.flow.dit import DiT
from cosy.flow.dit_model import DiTFlowModel
from cosy.hift.causal_generator import CausalHiFTGenerator
from cosy.hift.weights import unfold_weight_norm, weight_normed_keys
from cosy.model.config import ModelConfig

YAML = "cosyvoice3.yaml"


@dataclass(frozen=True)
class SpeechSize:
    pre_channels: int  # flow pre_lookahead_layer.channels
    dit_dim: int
    dit_depth: int
    dit_heads: int
    dit_head_dim: int
    hift_channels: int  # HiFT base_channels = f0 predictor cond_channels


SPEECH_SIZES = {
    "full": SpeechSize(pre_channels=1024, dit_dim=1024, dit_depth=22, dit_heads=16, dit_head_dim=64, hift_channels=512),
    "tiny": SpeechSize(pre_channels=64, dit_dim=64, dit_depth=2, dit_heads=2, dit_head_dim=32, hift_channels=64),
}


def yaml_text(size: str, llm_size: int) -> str:
    """cosyvoice3.yaml for `size` (the LM width is the LM builder's, e.g. 896 / 64)."""
    template = resources.files(__package__).joinpath("cosyvoice3.yaml.template").read_text(encoding="utf-8")
    return template.format(llm_size=llm_size, **vars(SPEECH_SIZES[size]))


def _save(state_dict: dict[str, torch.Tensor], path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save({k: v.contiguous() for k, v in state_dict.items()}, tmp)
    os.replace(tmp, path)


def _voiced_f0(hift: CausalHiFTGenerator) -> None:
    """Make the random f0 predictor say 'voiced, roughly 100-300 Hz' so the sine source is exercised
    (as initialised it predicts a few Hz: all unvoiced)."""
    clf = hift.f0_predictor.classifier
    clf.weight.mul_(40.0)
    clf.bias.fill_(180.0)


def flow_hift_state_dicts(cfg: ModelConfig, seed: int = 0) -> tuple[dict, dict]:
    """(flow.pt, hift.pt) state dicts of random modules for `cfg` (read from a cosyvoice3.yaml), seeded;
    the caller's RNG is left untouched."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        flow = DiTFlowModel(cfg.flow, DiT)
        hift = CausalHiFTGenerator(cfg.hift)
        _voiced_f0(hift)
        hift_sd = unfold_weight_norm(hift.state_dict(), weight_normed_keys(hift), legacy=False)
        return flow.state_dict(), {k: v.float() for k, v in hift_sd.items()}


def write_flow_hift(out_dir: str | Path, cfg: ModelConfig, seed: int = 0) -> None:
    """Write flow.pt and hift.pt (official names) into `out_dir` (atomically, each)."""
    out = Path(out_dir)
    flow_sd, hift_sd = flow_hift_state_dicts(cfg, seed)
    _save(flow_sd, out / "flow.pt")
    _save(hift_sd, out / "hift.pt")
