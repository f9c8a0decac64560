"""What the flow stage works on besides tokens: the voice prompt as the flow sees it, and the batchable jobs
(`Token2Wav.run_jobs` / `run_chunks`) that streams and whole utterances hand to the speech scheduler."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from cosy.flow import incremental


@dataclass
class FlowPrompt:
    """The voice prompt as the flow sees it.

    tokens: (1, Tp) int speech tokens; mel: (1, 2*Tp, 80) 24 kHz prompt mel; embedding: (1, 192) CAM++.
    cache_key: set for prompts that recur (saved voices): streaming keeps their final prompt chunks' flow
    state under this key (see `cosy.speech.cache`).
    """

    tokens: Tensor
    mel: Tensor
    embedding: Tensor
    cache_key: str | None = None



@dataclass
class ChunkInputs:
    """What a streaming chunk's incremental flow needs: the encoder's conditions over all frames so far
    (mu, cond (1, 80, F); spks (1, 80)), the state of the frames it continues, and its first emitted frame."""

    mu: Tensor
    spks: Tensor
    cond: Tensor
    state: incremental.FlowState | None
    start: int

    @property
    def past(self) -> int:
        return self.state.frames if self.state is not None else 0


@dataclass
class ChunkJob:
    """A streaming chunk's incremental flow that may run in one batch with other streams' chunks at the same
    place (`Token2Wav.run_chunks`): `prepare()` runs its encoder, `finish(inputs, mel, state)` -> its mel."""

    prepare: Callable[[], ChunkInputs]
    finish: Callable[[ChunkInputs, Tensor, incremental.FlowState], Tensor]
    frames: int  # new mel frames (its cost in a batch)


@dataclass
class FlowJob:
    """A whole-utterance flow (full attention, final) that may run in one padded batch with others'.

    `finish(mel)` turns this row's mel (1, 80, F) into the request's result (HiFT, speed, stream state).
    """

    tokens: Tensor  # (1, T) int
    prompt: FlowPrompt
    finish: Callable[[Tensor], Any]

    @property
    def frames(self) -> int:
        """Mel frames this row takes in a padded batch (prompt + target)."""
        return 2 * (self.prompt.tokens.shape[1] + self.tokens.shape[1])
