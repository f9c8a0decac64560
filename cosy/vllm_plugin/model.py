"""`CosyVoice2ForCausalLM`: vLLM's Qwen2 with CosyVoice2's biased output head (`llm_decoder`), and
`CosyVoice3ForCausalLM` (head without bias: stock Qwen2 with an untied head).

Each family registers its class (`ModelFamily.vllm_model`); the vocabulary size is read from config.json.
The head computes the logits in float32 (config.json's `head_dtype`, `cosy.lm.export`) whatever `--dtype`;
on the CPU its weight is kept in float32 too (`_head_params_dtype`).

The exported checkpoint (`cosy.lm.export`) is a Qwen2 whose 6564-id vocabulary is the speech tokens:
embed_tokens = speech_embedding (what each decode step feeds), lm_head = llm_decoder. Stock Qwen2 has no
lm_head bias, so the head is rebuilt with one and the bias is passed to the logits computation.
"""
from __future__ import annotations

import torch
from vllm.config import VllmConfig
from vllm.distributed import get_pp_group
from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.utils import maybe_prefix
from vllm.platforms import current_platform


def _head_params_dtype(vllm_config: VllmConfig) -> torch.dtype | None:
    """The head weight's dtype: on the CPU the head dtype (float32: vLLM's CPU path would otherwise cast a
    bfloat16 weight to it at every step, and the file's weight stays as it is); elsewhere the model's
    (None; vLLM multiplies it into a float32 result)."""
    return vllm_config.model_config.head_dtype if current_platform.is_cpu() else None


class CosyVoice2ForCausalLM(Qwen2ForCausalLM):
    """Qwen2ForCausalLM with `lm_head = ParallelLMHead(6564, hidden, bias=True)`; weights load unchanged."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        if self.config.tie_word_embeddings:
            raise ValueError("CosyVoice2ForCausalLM needs tie_word_embeddings=false (its head is llm_decoder, "
                             "not the speech embedding); re-export with cosy.lm.export")
        if get_pp_group().is_last_rank:
            self.lm_head = ParallelLMHead(self.config.vocab_size, self.config.hidden_size, bias=True,
                                          params_dtype=_head_params_dtype(vllm_config),
                                          quant_config=self.quant_config, prefix=maybe_prefix(prefix, "lm_head"))

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states, self.lm_head.bias)


class CosyVoice3ForCausalLM(Qwen2ForCausalLM):
    """CosyVoice3's LM as exported: stock Qwen2 over the 6761 speech ids with an untied head without bias
    (`llm_decoder`); the CosyVoice3 family registers it so that its exports are told apart from plain Qwen2."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        if self.config.tie_word_embeddings:
            raise ValueError("CosyVoice3ForCausalLM needs tie_word_embeddings=false (its head is llm_decoder, "
                             "not the speech embedding); re-export with cosy.lm.export")
        dtype = _head_params_dtype(vllm_config)
        if get_pp_group().is_last_rank and dtype is not None and dtype != self.lm_head.weight.dtype:
            self.lm_head = ParallelLMHead(self.config.vocab_size, self.config.hidden_size, params_dtype=dtype,
                                          quant_config=self.quant_config, prefix=maybe_prefix(prefix, "lm_head"))
