"""The LM prompt as embeddings: [sos, embed_tokens(prompt_text ++ text), task_id, speech_embedding(prompt)].

Both the embedded LM and frontends that talk to a remote backend build it; a frontend needs only the
embedding tables of llm.pt, not the transformer (`PromptEmbedder`). Where sos and task_id come from is a
family fact (`ModelFamily.sos` / `.task_id`): CosyVoice2 rows 0 and 1 of `llm_embedding`, CosyVoice3 rows
6561 and 6563 of `speech_embedding`.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from cosy.model.family import ModelFamily
from cosy.model.files import ModelDir

TABLES = {"llm_embedding": "llm_embedding.weight", "embed_tokens": "llm.model.model.embed_tokens.weight",
          "speech_embedding": "speech_embedding.weight"}  # table name -> llm.pt key


def ids_tensor(ids: Sequence[int] | Tensor, limit: int, what: str, device: torch.device | str = "cpu") -> Tensor:
    """Token ids as a (N,) long tensor; ValueError naming `what` when an id is outside [0, limit)."""
    t = torch.as_tensor(ids if isinstance(ids, Tensor) else list(ids), dtype=torch.long).reshape(-1)
    if t.numel() and (int(t.min()) < 0 or int(t.max()) >= limit):
        raise ValueError(f"{what} ids must lie in [0, {limit}), got {int(t.min())}..{int(t.max())}")
    return t.to(device)


def tables_of(family: ModelFamily) -> tuple[str, ...]:
    """The tables a family's prompt reads: embed_tokens, speech_embedding and those of sos / task_id."""
    return tuple(dict.fromkeys(("embed_tokens", "speech_embedding", family.sos.table, family.task_id.table)))


@torch.no_grad()  # not inference_mode: callers may modify or store the result
def build_prompt_embeds(tables: dict[str, Tensor], family: ModelFamily, text_ids: Sequence[int] | Tensor,
                        prompt_text_ids: Sequence[int] | Tensor = (),
                        prompt_speech_tokens: Sequence[int] | Tensor = ()) -> Tensor:
    """Tables {"embed_tokens": (V, H), "speech_embedding": (S, H), CosyVoice2's "llm_embedding": (2, H)}
    -> (1, 2 + len(prompt_text) + len(text) + len(prompt_speech), H)."""
    embed_tokens = tables["embed_tokens"]
    dev = embed_tokens.device
    text = torch.cat([ids_tensor(prompt_text_ids, embed_tokens.size(0), "prompt text", dev),
                      ids_tensor(text_ids, embed_tokens.size(0), "text", dev)])
    speech = ids_tensor(prompt_speech_tokens, family.tokens.size, "prompt speech token", dev)
    sos, task = family.sos, family.task_id
    return torch.cat([tables[sos.table][sos.row:sos.row + 1], embed_tokens[text],
                      tables[task.table][task.row:task.row + 1], tables["speech_embedding"][speech]]).unsqueeze(0)


@torch.no_grad()
def embed_segments(tables: dict[str, Tensor], family: ModelFamily, segments) -> Tensor:
    """`cosy.lm.bistream.Segment`s -> (1, sum of their lengths, H): sos / task_id rows, embed_tokens of
    (prompt) text ids, speech_embedding of (prompt) speech ids."""
    embed_tokens, speech = tables["embed_tokens"], tables["speech_embedding"]
    dev, rows = embed_tokens.device, []
    for seg in segments:
        if seg.kind in ("sos", "task_id"):
            row = family.sos if seg.kind == "sos" else family.task_id
            rows.append(tables[row.table][row.row:row.row + 1])
        elif seg.kind in ("prompt_text", "text"):
            rows.append(embed_tokens[ids_tensor(seg.ids, embed_tokens.size(0), seg.kind, dev)])
        else:
            rows.append(speech[ids_tensor(seg.ids, speech.size(0), seg.kind, dev)])
    return torch.cat(rows).unsqueeze(0)


class PromptEmbedder:
    """The embedding tables of llm.pt, memory-mapped: rows are read only when a prompt uses them."""

    def __init__(self, tables: dict[str, Tensor], family: ModelFamily):
        self.tables, self.family = tables, family

    @classmethod
    def from_model_dir(cls, model_dir: str | Path | ModelDir, variant: str | None = None) -> "PromptEmbedder":
        """The tables of llm.pt (or of the LM `variant`'s file, e.g. CosyVoice3's "rl": llm.rl.pt)."""
        md = model_dir if isinstance(model_dir, ModelDir) else ModelDir(model_dir)
        llm = md.llm_name(variant)
        sd = md.state_dict(llm)
        names = tables_of(md.family)
        missing = [TABLES[n] for n in names if TABLES[n] not in sd]
        if missing:
            raise ValueError(f"{md.file(llm)} lacks {', '.join(missing)}")
        return cls({name: sd[TABLES[name]] for name in names}, md.family)

    @property
    def hidden_size(self) -> int:
        return self.tables["embed_tokens"].size(1)

    def segments(self, segments) -> Tensor:
        """(1, L, H) of `cosy.lm.bistream.Segment`s (see `embed_segments`)."""
        return embed_segments(self.tables, self.family, segments)

    @torch.no_grad()
    def speech(self, ids: Sequence[int]) -> Tensor:
        """(1, n, H): generated speech tokens as the LM is fed them (a continued decode's prompt,
        `cosy.lm.first_chunk`)."""
        table = self.tables["speech_embedding"]
        return table[ids_tensor(ids, self.family.tokens.size, "speech token", table.device)].unsqueeze(0)

    def __call__(self, text_ids: Sequence[int] | Tensor, prompt_text_ids: Sequence[int] | Tensor = (),
                 prompt_speech_tokens: Sequence[int] | Tensor = ()) -> Tensor:
        return build_prompt_embeds(self.tables, self.family, text_ids, prompt_text_ids, prompt_speech_tokens)
