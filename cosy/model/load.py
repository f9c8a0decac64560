"""Build our modules from a model directory and load the official weights into them (strict).

Which classes are built is the model family's (`ModelFamily.flow`, `.flow_estimator`, `.hift`).
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from cosy.model.family import import_object
from cosy.model.files import ModelDir, empty_modules, load_strict


def as_model_dir(model_dir: str | Path | ModelDir) -> ModelDir:
    return model_dir if isinstance(model_dir, ModelDir) else ModelDir(model_dir)


def load_flow(model_dir: str | Path | ModelDir, device: str | torch.device = "cpu",
              dtype: torch.dtype = torch.float32) -> nn.Module:
    """flow.pt -> the family's flow model (CosyVoice2: FlowModel) in eval mode (speech tokens + prompt -> mel).

    `dtype` is the velocity estimator's (the U-Net the ODE runs 2 x n_timesteps times); the embedding, the
    encoder and the CFM's fixed noise stay float32 (`cosy.model.precision`)."""
    md = as_model_dir(model_dir)
    family, name = md.family, md.family.files.flow
    with empty_modules():  # no random init: every parameter comes from flow.pt
        flow = import_object(family.flow)(md.config.flow, import_object(family.flow_estimator))
    # the file's (memory-mapped) tensors become the parameters; .to() copies only when it must
    load_strict(flow, md.state_dict(name), md.file(name), assign=True, yaml=family.files.yaml)
    flow = flow.to(device=device, dtype=torch.float32)
    flow.decoder.estimator.to(dtype=dtype)
    return flow.eval()


def load_hift(model_dir: str | Path | ModelDir, device: str | torch.device = "cpu") -> nn.Module:
    """hift.pt (either weight-norm key style, optional `generator.` prefix) -> the family's vocoder
    (CosyVoice2: HiFTGenerator), float32.

    Weight norm is folded into plain weights at load, so inference does no normalisation work.
    """
    md = as_model_dir(model_dir)
    family, name = md.family, md.family.files.hift
    hift = import_object(family.hift)(md.config.hift)
    # the class folds its checkpoint (weight norm; CosyVoice3 keeps its f0 predictor in float64)
    load_strict(hift, hift.fold_checkpoint(md.state_dict(name)), md.file(name), yaml=family.files.yaml)
    return hift.to(device).eval()
