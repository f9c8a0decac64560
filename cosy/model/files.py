"""A CosyVoice2 model directory on disk: which files it holds, and loading them with clear errors.

The official layout (ModelScope `iic/CosyVoice2-0.5B`) is read unchanged. Every failure names the file
that is missing, unreadable, or does not fit the yaml.
"""
from __future__ import annotations

from functools import cached_property
from pathlib import Path

import torch
from torch import nn

from cosy.errors import CosyError
from cosy.model.config import ModelConfig, read_model_config

YAML = "cosyvoice2.yaml"
LLM = "llm.pt"
FLOW = "flow.pt"
HIFT = "hift.pt"
CAMPPLUS = "campplus.onnx"
SPEECH_TOKENIZER = "speech_tokenizer_v2.onnx"
QWEN_DIR = "CosyVoice-BlankEN"
ALL_FILES = (YAML, LLM, FLOW, HIFT, CAMPPLUS, SPEECH_TOKENIZER, QWEN_DIR)


class ModelDirError(CosyError, ValueError):
    """A model directory is missing a file, or a file is corrupt or does not match the yaml."""


class ModelDir:
    """The files of one model directory. Only reads; derived files go to a separate writable cache."""

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()
        if not self.path.is_dir():
            raise ModelDirError(f"model directory {self.path} does not exist or is not a directory")

    def file(self, name: str) -> Path:
        """Path of `name` inside the directory; raises ModelDirError naming it when it is absent."""
        p = self.path / name
        if not p.exists():
            raise ModelDirError(f"{p} is missing: {self.path} is not a complete CosyVoice2 model directory "
                                f"(expected {', '.join(ALL_FILES)})")
        return p

    def missing(self, names: tuple[str, ...] = ALL_FILES) -> list[str]:
        return [n for n in names if not (self.path / n).exists()]

    @cached_property
    def config(self) -> ModelConfig:
        try:
            return read_model_config(self.file(YAML))
        except ModelDirError:
            raise
        except ValueError as e:
            raise ModelDirError(str(e)) from None

    def state_dict(self, name: str) -> dict[str, torch.Tensor]:
        """Load a .pt state dict (tensors only, never pickled code); errors name the file."""
        p = self.file(name)
        try:
            try:
                sd = torch.load(p, map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:
                if "mmap" not in str(e):
                    raise
                sd = torch.load(p, map_location="cpu", weights_only=True)  # legacy (non-zip) format
        except Exception as e:  # truncated zip, pickle error, not a torch file ...
            raise ModelDirError(f"{p} is corrupt or not a PyTorch state dict ({type(e).__name__}: {e})") from None
        if not isinstance(sd, dict) or not all(isinstance(v, torch.Tensor) for v in sd.values()):
            raise ModelDirError(f"{p} does not hold a state dict of tensors")
        return sd


def load_strict(module: nn.Module, state_dict: dict[str, torch.Tensor], source: Path | str,
                assign: bool = False) -> None:
    """`module.load_state_dict(strict=True)` with an error that names the file and the offending keys.

    `assign=True` makes the (memory-mapped) file tensors the module's parameters: no copy, and pages
    never read (most of a 151936-row text embedding table) never take memory.
    """
    own = module.state_dict()
    missing = sorted(set(own) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(own))
    wrong = [f"{k} {tuple(state_dict[k].shape)} (expected {tuple(own[k].shape)})"
             for k in own if k in state_dict and state_dict[k].shape != own[k].shape]
    if missing or unexpected or wrong:
        parts = [f"{label}: {', '.join(keys[:5])}{' ...' if len(keys) > 5 else ''} ({len(keys)})"
                 for label, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", wrong))
                 if keys]
        raise ModelDirError(f"{source} does not match {YAML}: " + "; ".join(parts))
    module.load_state_dict(state_dict, strict=True, assign=assign)
