"""`--compile`: torch.compile of the two hot loops, the flow estimator and the embedded LM's decoder stack.

What is compiled (inductor with automatic dynamic shapes: a dimension seen at two sizes, the lengths, becomes
symbolic, the model widths stay fixed; `warm_up` shows each graph two lengths, so one graph then serves every
length and no request waits for a recompile of its own shape):
  * the flow's velocity estimator, the module run 2 x n_timesteps times per chunk: its whole-utterance and
    final-chunk forward, and the incremental function that streaming chunks use (`cosy.flow.incremental`);
  * the embedded LM's Qwen2 stack (`Qwen2Model.forward`): one graph for the prefill, one for the decode step.
Logits, RAS sampling, the ODE update, the encoder and HiFT stay eager. The default mode fuses the small
element-wise kernels (Mish, LayerNorm, GELU, rotary, RMSNorm) that make the eager GPU loops launch-bound;
CUDA graphs are not used: the decode step's key length grows every step and the flow's frames differ per
chunk, so every length would need its own recorded graph.

Numbers: the compiled kernels round differently from the eager ones (fused reductions, other orders), about
float32 rounding: `bench/compile_check.py` prints the difference and the speed on the device at hand, and
tests/test_compiled.py holds the mel within 1e-4 and the LM's logits within 1e-4 of eager. `warm_up` runs
each graph once at start-up, so compilation (tens of seconds, once per process) happens before traffic and
not on concurrent request threads (a rare later recompile, e.g. a length of 1, which dynamo specializes,
runs under dynamo's global compile lock).
"""
from __future__ import annotations

import torch
from torch import nn

from cosy.flow import incremental
from cosy.pipeline.token2wav import FlowPrompt

COMPILE_OPTIONS: dict = {}  # automatic dynamic (dynamic=True also makes the widths symbolic, which
#                              inductor's CPU linear fusion cannot lower)


def compile_flow(flow: nn.Module) -> None:
    """Compile `flow`'s estimator in place (its full forward and its incremental streaming function)."""
    est = flow.decoder.estimator
    est.forward = torch.compile(est.forward, **COMPILE_OPTIONS)
    est.incremental_fn = torch.compile(incremental.ESTIMATES[type(est)], **COMPILE_OPTIONS)


def compile_lm(lm: nn.Module) -> None:
    """Compile an embedded `SpeechLM`'s Qwen2 stack in place (prefill and decode step graphs)."""
    stack = lm.llm.model.model
    # each decoder layer reads its own `layer_idx`: as a static int it made every layer a recompile, and the
    # layers past dynamo's recompile limit (8) ran eager
    torch._dynamo.config.allow_unspec_int_on_nn_module = True
    stack.forward = torch.compile(stack.forward, **COMPILE_OPTIONS)


@torch.inference_mode()
def warm_up(t2w, lm: nn.Module | None = None) -> None:
    """Run each compiled graph once on small inputs (a 2-chunk stream and a whole utterance; a short LM
    generation), so that start-up pays for the compilation."""
    g = torch.Generator().manual_seed(0)
    prompt_tokens = torch.randint(0, 100, (1, 30), generator=g, dtype=torch.int32)
    prompt = FlowPrompt(prompt_tokens, torch.zeros(1, 60, t2w.flow.cfg.output_size),
                        torch.zeros(1, t2w.flow.cfg.spk_embed_dim))
    tokens = torch.randint(0, 100, (1, 60), generator=g, dtype=torch.int32)
    for n in (60, 47):  # two lengths: the length dimension becomes dynamic
        t2w.mel(tokens[:, :n], prompt)
    stream = t2w.stream(prompt, seed=0)
    stream.push_mels(tokens[0].tolist())  # chunks of 2 sizes after 2 state lengths
    stream.close()
    if lm is not None:
        for n in (8, 5):  # two prompt lengths; each decodes a few steps (a growing cache)
            embeds = torch.zeros(1, n, lm.cfg.hidden_size, dtype=lm.dtype, device=lm.device)
            for _ in lm.generate(embeds, min_len=3, max_len=3, seed=0):
                pass
