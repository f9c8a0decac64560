"""The LM half of a random CosyVoice3 directory: `cosyvoice3.yaml` (official format, sizes filled in), llm.pt
(`CosyVoice3LM` keys: no llm_embedding, 6761 speech rows, head without bias), `CosyVoice-BlankEN/` and the ONNX
stand-ins (`speech_tokenizer_v3.onnx`, `campplus.onnx`: same signatures as CosyVoice2's).

It runs first (`cosy.verify.random_model.WRITERS`): the flow and vocoder writers read the yaml it wrote.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

from cosy.model.families.cosyvoice3 import FAMILY
from cosy.verify.random_model.llm import write_llm_pt
from cosy.verify.random_model.onnx_models import write_campplus_onnx, write_speech_tokenizer_onnx
from cosy.verify.random_model.tokenizer_dir import write_tokenizer_dir


@dataclass(frozen=True)
class Size:
    """What `cosyvoice3.yaml.template` is filled with (the flow and vocoder writers read them from the yaml)."""

    llm_size: int  # Qwen2 hidden size (llm_input_size / llm_output_size)
    llm_layers: int
    llm_heads: int
    llm_kv_heads: int
    llm_intermediate: int
    pre_channels: int  # flow pre_lookahead_layer.channels
    dit_dim: int
    dit_depth: int
    dit_heads: int
    dit_head_dim: int
    hift_channels: int  # hift base_channels = f0 predictor cond_channels


SIZES = {
    # Fun-CosyVoice3-0.5B as published (reference/cosyvoice3-state-dict.txt)
    "full": Size(llm_size=896, llm_layers=24, llm_heads=14, llm_kv_heads=2, llm_intermediate=4864,
                 pre_channels=1024, dit_dim=1024, dit_depth=22, dit_heads=16, dit_head_dim=64,
                 hift_channels=512),
    # the golden-cv3 fixtures' dimensions (LM head dim 32: vLLM-CPU needs >= 32)
    "tiny": Size(llm_size=64, llm_layers=2, llm_heads=2, llm_kv_heads=1, llm_intermediate=128,
                 pre_channels=64, dit_dim=64, dit_depth=2, dit_heads=2, dit_head_dim=32, hift_channels=64),
}


def write(out: Path, size: str, seed: int, atomic_write) -> None:
    """Write the yaml, llm.pt, CosyVoice-BlankEN/ and the ONNX stand-ins of `size` into `out`."""
    dims = SIZES[size]
    files = FAMILY.files
    template = resources.files(__package__).joinpath("cosyvoice3.yaml.template").read_text(encoding="utf-8")
    text = template.format(**asdict(dims))
    atomic_write(out / files.yaml, lambda p: p.write_text(text, encoding="utf-8"))
    llm_dims = (dims.llm_size, dims.llm_layers, dims.llm_heads, dims.llm_kv_heads, dims.llm_intermediate)
    write_llm_pt(out / files.llm, *llm_dims, seed=seed, family=FAMILY)
    write_tokenizer_dir(out / files.qwen_dir, *llm_dims)
    write_speech_tokenizer_onnx(out / files.speech_tokenizer, seed=seed)
    write_campplus_onnx(out / files.campplus, seed=seed)


__all__ = ["SIZES", "Size", "write"]
