"""Build our modules from a model directory and load the official weights into them (strict)."""
from __future__ import annotations

from pathlib import Path

import torch

from cosy.flow.model import FlowModel
from cosy.hift.generator import HiFTGenerator
from cosy.hift.weights import fold_weight_norm
from cosy.model.files import FLOW, HIFT, ModelDir, load_strict


def as_model_dir(model_dir: str | Path | ModelDir) -> ModelDir:
    return model_dir if isinstance(model_dir, ModelDir) else ModelDir(model_dir)


def load_flow(model_dir: str | Path | ModelDir, device: str | torch.device = "cpu",
              dtype: torch.dtype = torch.float32) -> FlowModel:
    """flow.pt -> FlowModel in eval mode (speech tokens + prompt -> mel)."""
    md = as_model_dir(model_dir)
    with torch.device("meta"):  # no random init: every parameter comes from flow.pt
        flow = FlowModel(md.config.flow)
    # the file's (memory-mapped) tensors become the parameters; .to() copies only when it must
    load_strict(flow, md.state_dict(FLOW), md.file(FLOW), assign=True)
    return flow.to(device=device, dtype=dtype).eval()


def load_hift(model_dir: str | Path | ModelDir, device: str | torch.device = "cpu") -> HiFTGenerator:
    """hift.pt (either weight-norm key style, optional `generator.` prefix) -> HiFTGenerator, float32.

    Weight norm is folded into plain weights at load, so inference does no normalisation work.
    """
    md = as_model_dir(model_dir)
    hift = HiFTGenerator(md.config.hift)
    load_strict(hift, fold_weight_norm(md.state_dict(HIFT)), md.file(HIFT))
    return hift.to(device).eval()
