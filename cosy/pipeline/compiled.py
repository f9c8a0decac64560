"""`--compile`: torch.compile of the two hot loops, the flow estimator and the embedded LM's decoder stack.

What is compiled (inductor; the lengths and the flow's batch symbolic from the first compile, FLOW_DYNAMIC and
LM_DYNAMIC, the model widths fixed; `warm_up` runs each graph at two lengths, the second compiling nothing, so
one graph serves every length and no request waits for a compilation of its own shape):
  * the flow's velocity estimator, the module run 2 x n_timesteps times per chunk: its whole-utterance and
    final-chunk forward, and the incremental function that streaming chunks use (`cosy.flow.incremental`);
  * the embedded LM's Qwen2 stack (`Qwen2Model.forward`), whole (no graph break): graphs for the prefill, the
    decode step and a chunk after a cache (bistream segments).
Logits, RAS sampling, the ODE update, the encoder and HiFT stay eager. The default mode fuses the small
element-wise kernels (Mish, LayerNorm, GELU, rotary, RMSNorm) that make the eager GPU loops launch-bound;
CUDA graphs are not used: the decode step's key length grows every step and the flow's frames differ per
chunk, so every length would need its own recorded graph.

Numbers: the compiled kernels round differently from the eager ones (fused reductions, other orders), about
float32 rounding: `bench/compile_check.py` prints the difference and the speed on the device at hand, and
tests/test_compiled.py holds the mel within 1e-4 and the LM's logits within 1e-4 of eager. `warm_up` runs
each graph at start-up, so compilation (a minute or two on the CPU, once per process) happens before
traffic: tests/test_compiled.py checks that later requests of new lengths compile nothing.
"""
from __future__ import annotations

import torch
from torch import nn

from cosy.flow import incremental
from cosy.pipeline.token2wav import FlowPrompt

COMPILE_OPTIONS: dict = {}  # not dynamic=True: it makes the widths symbolic too, which inductor's CPU
#                              linear fusion cannot lower (the lengths are named below instead)

# The inputs' lengths (and the flow's batch), symbolic from the first compile: else each graph is compiled
# static at its first size, then again dynamic at its second, and the static one (about half of the kernels
# `warm_up` builds) serves no request. Dynamo's source names of the compiled functions' arguments (dim after
# the colon; an int without one); the widths stay static.
FLOW_DYNAMIC = ("L['x']:0", "L['x']:2", "L['mu']:0", "L['mu']:2", "L['cond']:0", "L['cond']:2", "L['spks']:0",
                "L['t']:0", "L['lengths']:0", "L['run'].past", "L['run'].mask:0", "L['run'].mask:1",
                r"L\['run'\]\.old\.steps\[\d+\]\['[^']+'\]:0", r"L\['run'\]\.old\.steps\[\d+\]\['[^']+\.[kv]'\]:2")
LM_DYNAMIC = ("L['inputs_embeds']:1", "L['cache'].length", "L['cache'].max_len", "L['cache'].k:3",
              "L['cache'].v:3", "L['rope'].cos:0", "L['rope'].sin:0")


def _mark_dynamic(sources: tuple[str, ...]) -> None:
    """Add `sources` to torch.compiler.config.dynamic_sources (kept: what the user set there)."""
    have = [s for s in torch.compiler.config.dynamic_sources.replace(" ", "").split(",") if s]
    torch.compiler.config.dynamic_sources = ",".join(have + [s for s in sources if s not in have])


def compile_flow(flow: nn.Module, backend: str = "inductor") -> None:
    """Compile `flow`'s estimator in place (its full forward and its incremental streaming function).
    `backend` "eager": dynamo captures and guards the same graphs, but no kernels are generated (tests)."""
    # the incremental function's variants (first chunk, chunk after a state, batched rows) come to 4 graphs
    # with `--flow_batch`; head room over dynamo's default limit of 8 per function for inputs of other kinds
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 16)
    _mark_dynamic(FLOW_DYNAMIC)
    est = flow.decoder.estimator
    est.forward = torch.compile(est.forward, backend=backend, **COMPILE_OPTIONS)
    est.incremental_fn = torch.compile(incremental.ESTIMATES[type(est)], backend=backend, **COMPILE_OPTIONS)


def compile_lm(lm: nn.Module, backend: str = "inductor") -> None:
    """Compile an embedded `SpeechLM`'s Qwen2 stack in place (prefill, decode step and chunk graphs);
    `backend` as for `compile_flow`."""
    _mark_dynamic(LM_DYNAMIC)
    stack = lm.llm.model.model
    stack.forward = torch.compile(stack.forward, backend=backend, **COMPILE_OPTIONS)


@torch.inference_mode()
def warm_up(t2w, lm: nn.Module | None = None, rows: int = 1) -> None:
    """Run each compiled graph on small inputs at two sizes of each length (whole utterances; streams of
    two prompt lengths, so that first chunks and chunks after a state both vary; the LM's prefill, decode
    step and chunk after a cache), so that start-up pays for every compilation and traffic for none.
    rows > 1: the worker batches flows (`--flow_batch`), so batches of 2 and 3 rows run too (the batch
    dimension then is dynamic as well)."""
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 100, (1, 200), generator=g, dtype=torch.int32)
    for n_prompt, n in ((30, 60), (23, 47)):
        prompt = FlowPrompt(torch.randint(0, 100, (1, n_prompt), generator=g, dtype=torch.int32),
                            torch.zeros(1, 2 * n_prompt, t2w.flow.cfg.output_size),
                            torch.zeros(1, t2w.flow.cfg.spk_embed_dim))
        t2w.mel(tokens[:, :n], prompt)
        stream = t2w.stream(prompt, seed=0)
        stream.push_mels(tokens[0, :n + 50].tolist())
        stream.close()
    for k in (2, 3) if rows > 1 else ():
        t2w.run_jobs([t2w.whole_job(tokens[:, :60 - k], prompt) for _ in range(k)])
        streams = [t2w.stream(prompt, seed=i) for i in range(k)]
        for s in streams:
            s.add(tokens[0].tolist())
        while all(s.due() for s in streams) and t2w.state_budget is not None:  # chunks 2, 3: one batch each
            t2w.run_chunks([s.chunk_job() for s in streams])
        for s in streams:
            s.close()
    if lm is not None:
        # the three graphs of the stack, each at two lengths: a prefill, decode steps (a growing cache), and
        # a chunk after a cache (bistream text segments); two cache sizes make the cache length dynamic too
        def zeros(n: int) -> torch.Tensor:
            return torch.zeros(1, n, lm.cfg.hidden_size, dtype=lm.dtype, device=lm.device)

        for n in (8, 5):
            cache, rope = lm._start(zeros(n), 12)
            for m in (n, 1, 1, n - 2, 1):
                lm._step(zeros(m), cache, rope)
