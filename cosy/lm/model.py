"""The speech-token LM: official CosyVoice2 `Qwen2LM` and CosyVoice3 `CosyVoice3LM` (inference only), text +
voice prompt -> speech tokens.

Token ids, stop set, sos/task_id rows, head bias and length ratios come from the model family
(`ModelDir.family`): CosyVoice3 has no `llm_embedding` table (sos 6561 and task_id 6563 are rows of its
6761-row `speech_embedding`) and its `llm_decoder` has no bias; everything else is the same module.

Prompt layout (as embeddings, positions from 0):
    [sos, embed_tokens(prompt_text ++ text), task_id, speech_embedding(prompt_speech_tokens)]
Per mode: zero-shot and saved voice pass prompt text + prompt speech tokens; cross-lingual passes neither;
instruct passes the instruction (ending in <|endofprompt|>) as prompt text and no speech tokens.
Each decode step feeds speech_embedding[token]; logits = llm_decoder(final-normed hidden), in float32 whatever
the backbone's dtype.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from cosy.lm.config import LMConfig, read_lm_config
from cosy.lm.prompt import build_prompt_embeds, embed_segments, tables_of
from cosy.lm.qwen2 import KVCache, Linear, Qwen2Encoder, RotaryTable, pack_linears
from cosy.lm.sampling import SamplingParams, ras_sample
from cosy.model.family import ModelFamily
from cosy.model.files import ModelDir, ModelDirError, empty_modules, load_strict
from cosy.model.precision import cpu_bf16_units

LM_HEAD_KEY = "llm.model.lm_head.weight"  # tied copy of embed_tokens in llm.pt; never used
log = logging.getLogger(__name__)


class SpeechLM(nn.Module):
    """Qwen2 backbone + the family's heads. Attribute names mirror llm.pt's keys.

    The module holds no per-request state: the KV cache, history and RNG of a request live inside one
    `generate()` call, so several threads may generate at once with one shared, read-only module.
    """

    kernels = "plain weights"  # how its linear layers run (`from_model_dir` packs them where that pays)

    def __init__(self, cfg: LMConfig, family: ModelFamily, sampling: SamplingParams | None = None):
        super().__init__()
        if cfg.num_speech_rows != family.tokens.vocab:
            raise ValueError(f"{family.name} has {family.tokens.vocab} speech ids, the config {cfg.num_speech_rows}")
        self.cfg, self.family, self.tokens = cfg, family, family.tokens
        self.sampling = sampling or SamplingParams()
        # Random init is thrown away (weights come from llm.pt); don't let it consume the caller's CPU RNG.
        with torch.random.fork_rng(devices=[]):
            if "llm_embedding" in tables_of(family):  # CosyVoice2: sos and task_id rows
                self.llm_embedding = nn.Embedding(2, cfg.hidden_size)
            self.llm = Qwen2Encoder(cfg)
            self.llm_decoder = Linear(cfg.hidden_size, cfg.num_speech_rows, bias=family.lm_head_bias)
            self.speech_embedding = nn.Embedding(cfg.num_speech_rows, cfg.hidden_size)

    @classmethod
    def from_model_dir(cls, model_dir: str | Path, device: str | torch.device = "cpu",
                       dtype: torch.dtype = torch.float32, variant: str | None = None) -> SpeechLM:
        """The family's yaml + CosyVoice-BlankEN/config.json + llm.pt (strict; only the unused tied
        `llm.model.lm_head.weight` is dropped). `variant`: another checkpoint of the family
        (`ModelFiles.llm_variants`, e.g. CosyVoice3's "rl" = llm.rl.pt). Errors name the offending file."""
        md = model_dir if isinstance(model_dir, ModelDir) else ModelDir(model_dir)
        mc, family = md.config, md.family
        qwen_config = md.file(family.files.qwen_dir) / "config.json"
        if not qwen_config.exists():
            raise ModelDirError(f"{qwen_config} is missing (the Qwen2 config of the LM backbone)")
        try:
            cfg = read_lm_config(qwen_config, mc.llm_input_size, mc.speech_token_size, family.tokens.vocab)
        except ValueError as e:
            raise ModelDirError(str(e)) from None
        with empty_modules():  # no wasted random init of ~0.5 G parameters
            lm = cls(cfg, family, mc.sampling)
        llm_name = md.llm_name(variant)
        llm = md.file(llm_name)
        sd = md.state_dict(llm_name)
        sd.pop(LM_HEAD_KEY, None)
        if torch.device(device).type == "cpu" and all(v.dtype == dtype for v in sd.values()):
            # use the memory-mapped file tensors as they are: the text embedding table (0.5 GB at full
            # size, a few rows read per request) then costs no memory
            load_strict(lm, sd, llm, assign=True, yaml=family.files.yaml)
        else:
            # allocate in the target device/dtype and copy (casting) straight from the mmapped file
            lm = lm.to_empty(device=device).to(dtype=dtype)
            lm.llm_decoder.float()  # the file's head as it is (see below)
            load_strict(lm, sd, llm, yaml=family.files.yaml)
        # the head in float32 whatever the dtype: the logits that sampling reads are not rounded to a half
        # dtype (a head that stands as bf16 in the file only changes its dtype)
        lm.llm_decoder.float()
        if dtype == torch.bfloat16 and torch.device(device).type == "cpu" and pack_linears(lm):
            lm.kernels = f"oneDNN prepacked bfloat16 weights ({cpu_bf16_units()})"
        log.info("embedded LM: %s on %s, %s", str(dtype).removeprefix("torch."), device, lm.kernels)
        return lm.eval()

    @property
    def device(self) -> torch.device:
        return self.llm_decoder.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The backbone's and the embeddings' dtype (the head, `logits`, is float32 in any)."""
        return self.speech_embedding.weight.dtype

    @property
    def tables(self) -> dict[str, Tensor]:
        """The embedding tables by name (`cosy.lm.prompt.TABLES`)."""
        tables = {"embed_tokens": self.llm.model.model.embed_tokens.weight,
                  "speech_embedding": self.speech_embedding.weight}
        if hasattr(self, "llm_embedding"):  # CosyVoice2 only
            tables["llm_embedding"] = self.llm_embedding.weight
        return tables

    def segments(self, segments) -> Tensor:
        """(1, L, H) of `cosy.lm.bistream.Segment`s (see `cosy.lm.prompt.embed_segments`)."""
        return embed_segments(self.tables, self.family, segments)

    def prompt_embeds(self, text_ids: Sequence[int] | Tensor, prompt_text_ids: Sequence[int] | Tensor = (),
                      prompt_speech_tokens: Sequence[int] | Tensor = ()) -> Tensor:
        """(1, 2 + len(prompt_text) + len(text) + len(prompt_speech), H) prompt in the model dtype/device."""
        return build_prompt_embeds(self.tables, self.family, text_ids, prompt_text_ids, prompt_speech_tokens)

    def length_limits(self, n_text_tokens: int) -> tuple[int, int]:
        """(min_len, max_len) of the output for a target text of n tokens (prompt text not counted)."""
        return self.family.length_limits(n_text_tokens)

    def _start(self, prompt_embeds: Tensor, n_steps: int) -> tuple[KVCache, RotaryTable]:
        if prompt_embeds.dim() != 3 or prompt_embeds.size(0) != 1 or prompt_embeds.size(2) != self.cfg.hidden_size:
            raise ValueError(f"prompt_embeds must be (1, L, {self.cfg.hidden_size}), "
                             f"got {tuple(prompt_embeds.shape)}")
        total = prompt_embeds.size(1) + n_steps
        return (KVCache(self.cfg, total, self.device, self.dtype),
                RotaryTable(self.cfg, total, self.device, self.dtype))

    def _step(self, x: Tensor, cache: KVCache, rope: RotaryTable) -> tuple[Tensor, Tensor]:
        """Feed x (1, L, H); (logits (V,) float32, final-normed hidden (H,)) of the last position."""
        x = x.to(device=self.device, dtype=self.dtype)
        if torch.is_inference_mode_enabled() and not x.is_inference():
            # one kind of input tensor: `--compile` guards on it (inference tensor or not, requires_grad, as
            # a parameter's view has even here), and each kind would compile graphs of its own
            x = x.clone()
        h = self.llm.model.model(x, cache, rope)[0, -1]
        return self.logits(h), h

    def logits(self, h: Tensor) -> Tensor:
        """float32 logits (..., V) of final-normed hidden states (..., H): the head runs in float32 (the
        sampling's input is not rounded to the backbone's half dtype)."""
        return self.llm_decoder(h.float())

    def _embed_speech(self, token: int) -> Tensor:
        return self.speech_embedding.weight[token].view(1, 1, -1)

    @torch.inference_mode()
    def generate(self, prompt_embeds: Tensor, min_len: int, max_len: int, seed: int | None = None,
                 params: SamplingParams | None = None) -> Iterator[int]:
        """Yield speech tokens as they are produced (never the stop token).

        Stops on a stop token (`tokens.stop`, CosyVoice2: 6561/6562/6563, CosyVoice3: 6561..6760) or after
        max_len tokens. Before min_len only `tokens.min_len_mask` (6561: CosyVoice2's eos, CosyVoice3's sos)
        is masked, as in the official code, so other stop ids can still end the output early. Every token
        is yielded, silent ones too (`cosy.lm.silence` drops long silent runs downstream). The same seed gives
        the same tokens; the global RNG is not touched (seed None draws a fresh seed from the OS).
        """
        p = params or self.sampling
        gen = torch.Generator()  # on the CPU: the sampler draws there (cosy.lm.sampling)
        if seed is None:
            gen.seed()
        else:
            gen.manual_seed(seed)
        cache, rope = self._start(prompt_embeds, max(max_len, 0))
        history: list[int] = []
        stop_ids = self._stop_ids(p)
        x = prompt_embeds
        for i in range(max_len):
            logits, _ = self._step(x, cache, rope)
            token = self._draw(logits, history, p, gen, stop_ids, mask_eos=i < min_len)
            if token is None:
                return
            yield token
            history.append(token)
            x = self._embed_speech(token)

    def _stop_ids(self, p: SamplingParams) -> Tensor | None:
        """The stop ids `p.ignore_stop` masks at every step: on the device once, not a host list copied over
        at every step."""
        return torch.tensor(sorted(self.tokens.stop), device=self.device) if p.ignore_stop else None

    def _draw(self, logits: Tensor, history: list[int], p: SamplingParams, gen: torch.Generator,
              stop_ids: Tensor | None, mask_eos: bool) -> int | None:
        """One step's token from its logits (V,) (RAS over `history`); None for a stop token."""
        if stop_ids is not None:
            logits.index_fill_(-1, stop_ids, float("-inf"))
        token = ras_sample(logits, history, p, gen, mask_eos=mask_eos, tokens=self.tokens)
        return None if token in self.tokens.stop else token

    @torch.no_grad()
    def teacher_forced_logprobs(self, prompt_embeds: Tensor, continuation: Sequence[int]) -> tuple[Tensor, Tensor]:
        """Log-softmax (N, V) before any eos masking and final-normed hidden (N, H), float32, for
        N = len(continuation): step 0 after the prompt, step i after feeding continuation[i-1] through
        the KV cache (the decode path of `generate`)."""
        tokens = [int(t) for t in continuation]
        cache, rope = self._start(prompt_embeds, len(tokens))
        logps, hiddens = [], []
        x = prompt_embeds
        for token in tokens:
            logits, h = self._step(x, cache, rope)
            logps.append(logits.log_softmax(dim=-1))
            hiddens.append(h.float())
            x = self._embed_speech(token)
        if not tokens:
            return torch.zeros(0, self.cfg.num_speech_rows), torch.zeros(0, self.cfg.hidden_size)
        return torch.stack(logps), torch.stack(hiddens)


__all__ = ["SpeechLM"]
