"""A model directory on disk: its family, which files it holds, and loading them with clear errors.

The official layout (ModelScope `iic/CosyVoice2-0.5B`) is read unchanged. The family (`cosy.model.families`)
is detected from the yaml file name and names every other file. Every failure names the file that is
missing, unreadable, or does not fit the yaml.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from cosy.errors import CosyError
from cosy.model import families
from cosy.model.config import ModelConfig, read_model_config
from cosy.model.families.cosyvoice2 import FAMILY as COSYVOICE2
from cosy.model.family import ModelFamily

# CosyVoice2's file names, for tools that fetch or build CosyVoice2 directories (the downloader, tests).
# Code that reads a directory asks its family instead: `ModelDir(path).family.files`.
YAML, LLM, FLOW, HIFT = COSYVOICE2.files.yaml, COSYVOICE2.files.llm, COSYVOICE2.files.flow, COSYVOICE2.files.hift
CAMPPLUS, SPEECH_TOKENIZER, QWEN_DIR = (COSYVOICE2.files.campplus, COSYVOICE2.files.speech_tokenizer,
                                        COSYVOICE2.files.qwen_dir)
ALL_FILES = COSYVOICE2.files.all


class ModelDirError(CosyError, ValueError):
    """A model directory is missing a file, or a file is corrupt or does not match the yaml."""


def detect_family(path: str | Path) -> ModelFamily:
    """The family of a model directory, by its yaml file name; ModelDirError naming the names looked for."""
    try:
        family = families.detect(path)
    except ValueError as e:
        raise ModelDirError(str(e)) from None
    if family is None:
        raise ModelDirError(f"{path} is not a known model directory: it holds none of "
                            f"{', '.join(families.yaml_names())} (the yaml names the model family)")
    return family


class ModelDir:
    """The files of one model directory. Only reads; derived files go to a separate writable cache.

    `family` is detected on first use, so a directory still being downloaded can be inspected (`missing`).
    """

    def __init__(self, path: str | Path, family: ModelFamily | None = None):
        self.path = Path(path).expanduser()
        if not self.path.is_dir():
            raise ModelDirError(f"model directory {self.path} does not exist or is not a directory")
        if family is not None:
            self.family = family  # fills the cached_property

    @cached_property
    def family(self) -> ModelFamily:
        return detect_family(self.path)

    def file(self, name: str) -> Path:
        """Path of `name` inside the directory; raises ModelDirError naming it when it is absent."""
        p = self.path / name
        if not p.exists():
            try:
                family = self.family
            except ModelDirError as e:
                raise ModelDirError(f"{p} is missing, and {e}") from None
            raise ModelDirError(f"{p} is missing: {self.path} is not a complete {family.name} model directory "
                                f"(expected {', '.join(family.files.all)})")
        return p

    def llm_name(self, variant: str | None = None) -> str:
        """The file name of the LM checkpoint `variant` (None: llm.pt; CosyVoice3 "rl": llm.rl.pt), checked to
        exist; ModelDirError naming the known variants or the missing file."""
        try:
            name = self.family.files.llm_file(variant)
        except ValueError as e:
            raise ModelDirError(str(e)) from None
        if name != self.family.files.llm and not (self.path / name).exists():
            raise ModelDirError(f"{self.path / name} is missing: the LM variant {variant!r} is that file beside "
                                f"{self.family.files.llm} (the published {self.family.name} directory ships it)")
        return name

    def missing(self, names: tuple[str, ...] | None = None) -> list[str]:
        """Names (default: every file of the family) absent from the directory. Without a known yaml the
        family is unknown: the answer is then the yaml names looked for, as one entry ('a.yaml or b.yaml')."""
        if names is None:
            try:
                names = self.family.files.all
            except ModelDirError:
                return [" or ".join(families.yaml_names())]
        return [n for n in names if not (self.path / n).exists()]

    @cached_property
    def config(self) -> ModelConfig:
        try:
            return read_model_config(self.file(self.family.files.yaml), self.family)
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


class _SkipInit(TorchFunctionMode):
    """`torch.nn.init`'s functions leave their tensor as it is (every nn.init function dispatches to an
    active mode first)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


@contextmanager
def empty_modules() -> Iterator[None]:
    """Modules built inside get parameters on the meta device and no random init: every parameter then
    comes from a checkpoint (`load_strict(..., assign=True)`). Init on meta is not free: an nn.Embedding's
    `normal_` there runs a Python kernel that imports torch._dynamo, a second of every process start.
    The mode is this thread's only (torch keeps a mode stack per thread)."""
    with torch.device("meta"), _SkipInit():
        yield


def load_strict(module: nn.Module, state_dict: dict[str, torch.Tensor], source: Path | str,
                assign: bool = False, yaml: str = "the model's yaml") -> None:
    """`module.load_state_dict(strict=True)` with an error that names the file and the offending keys.

    `assign=True` makes the (memory-mapped) file tensors the module's parameters: no copy, and pages
    never read (most of a 151936-row text embedding table) never take memory. `yaml` names the file the
    module was built from, for the message.
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
        raise ModelDirError(f"{source} does not match {yaml}: " + "; ".join(parts))
    module.load_state_dict(state_dict, strict=True, assign=assign)
