"""The LM prompt as embeddings: [sos, embed_tokens(prompt_text ++ text), task_id, speech_embedding(prompt)].

Both the embedded LM and frontends that talk to a remote backend build it; a frontend needs only the
three embedding tables of llm.pt, not the transformer (`PromptEmbedder`).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from cosy.model.files import LLM, ModelDir

SOS, TASK_ID = 0, 1  # rows of llm_embedding
TABLES = {"llm_embedding": "llm_embedding.weight", "embed_tokens": "llm.model.model.embed_tokens.weight",
          "speech_embedding": "speech_embedding.weight"}


def ids_tensor(ids: Sequence[int] | Tensor, limit: int, what: str, device: torch.device | str = "cpu") -> Tensor:
    """Token ids as a (N,) long tensor; ValueError naming `what` when an id is outside [0, limit)."""
    t = torch.as_tensor(ids if isinstance(ids, Tensor) else list(ids), dtype=torch.long).reshape(-1)
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= limit):
        raise ValueError(f"{what} ids must lie in [0, {limit}), got {int(t.min())}..{int(t.max())}")
    return t.to(device)


@torch.no_grad()  # not inference_mode: callers may modify or store the result
def build_prompt_embeds(llm_embedding: Tensor, embed_tokens: Tensor, speech_embedding: Tensor,
                        text_ids: Sequence[int] | Tensor, prompt_text_ids: Sequence[int] | Tensor = (),
                        prompt_speech_tokens: Sequence[int] | Tensor = (), speech_token_size: int = 6561) -> Tensor:
    """Tables (2, H), (V, H), (S, H) -> (1, 2 + len(prompt_text) + len(text) + len(prompt_speech), H)."""
    dev = embed_tokens.device
    text = torch.cat([ids_tensor(prompt_text_ids, embed_tokens.size(0), "prompt text", dev),
                      ids_tensor(text_ids, embed_tokens.size(0), "text", dev)])
    speech = ids_tensor(prompt_speech_tokens, speech_token_size, "prompt speech token", dev)
    return torch.cat([llm_embedding[SOS:SOS + 1], embed_tokens[text], llm_embedding[TASK_ID:TASK_ID + 1],
                      speech_embedding[speech]]).unsqueeze(0)


class PromptEmbedder:
    """The embedding tables of llm.pt, memory-mapped: rows are read only when a prompt uses them."""

    def __init__(self, tables: dict[str, Tensor], speech_token_size: int):
        self.tables, self.speech_token_size = tables, speech_token_size

    @classmethod
    def from_model_dir(cls, model_dir: str | Path | ModelDir) -> "PromptEmbedder":
        md = model_dir if isinstance(model_dir, ModelDir) else ModelDir(model_dir)
        sd = md.state_dict(LLM)
        missing = [k for k in TABLES.values() if k not in sd]
        if missing:
            raise ValueError(f"{md.file(LLM)} lacks {', '.join(missing)}")
        return cls({name: sd[key] for name, key in TABLES.items()}, md.config.speech_token_size)

    @property
    def hidden_size(self) -> int:
        return self.tables["llm_embedding"].size(1)

    def __call__(self, text_ids: Sequence[int] | Tensor, prompt_text_ids: Sequence[int] | Tensor = (),
                 prompt_speech_tokens: Sequence[int] | Tensor = ()) -> Tensor:
        t = self.tables
        return build_prompt_embeds(t["llm_embedding"], t["embed_tokens"], t["speech_embedding"], text_ids,
                                   prompt_text_ids, prompt_speech_tokens, self.speech_token_size)
