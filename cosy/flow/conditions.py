"""The CFM's prompt condition, shared by both families' flow models: each row's prompt mel in its first
frames, zeros after (the official `conds`)."""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def prompt_cond(prompt_feats: Sequence[Tensor], mel_lengths: Sequence[int], like: Tensor, channels: int) -> Tensor:
    """(B, channels, T) with row i's prompt mel (1, Tm_i, channels) in its first Tm_i frames; T = like.size(1)
    (`like`: (B, T, ...) for device and dtype). ValueError if a prompt is longer than its row's mel_lengths[i]."""
    cond = torch.zeros(len(prompt_feats), channels, like.size(1), device=like.device, dtype=like.dtype)
    for i, (pf, n_total) in enumerate(zip(prompt_feats, mel_lengths)):
        n_prompt = pf.size(1)
        if n_prompt > int(n_total):
            raise ValueError(f"prompt mel ({n_prompt} frames) is longer than the encoded tokens "
                             f"({int(n_total)} frames)")
        cond[i, :, :n_prompt] = pf[0].to(device=like.device, dtype=like.dtype).transpose(0, 1)
    return cond
