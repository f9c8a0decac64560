"""Speed control while streaming: the official linear time-stretch of the mel, made incremental."""
from __future__ import annotations

import math

import torch
from torch import Tensor


class MelStretcher:
    """Streaming linear time-stretch of mel frames (the official speed control, made incremental).

    Output frame j interpolates input position (j + 0.5) * speed - 0.5, like
    `F.interpolate(mode='linear', align_corners=False)` with scale `speed`; a frame is emitted as soon as
    both of its neighbours have arrived.
    """

    def __init__(self, speed: float):
        self.speed = speed
        self.frames: Tensor | None = None  # (B, C, n) input frames from index `self.base` on
        self.base = 0
        self.emitted = 0

    def push(self, mel: Tensor, final: bool = False) -> Tensor:
        """mel (B, C, n) new input frames -> (B, C, m) newly ready output frames."""
        self.frames = mel if self.frames is None else torch.cat([self.frames, mel], dim=2)
        total = self.base + self.frames.shape[2]
        if final:
            stop = int(total / self.speed)
        else:  # frame j needs input floor(x_j) + 1 < total
            stop = max(self.emitted, math.ceil((total - 0.5) / self.speed - 0.5))
            while stop > self.emitted and math.floor(max((stop - 0.5) * self.speed - 0.5, 0)) + 1 >= total:
                stop -= 1
        j = torch.arange(self.emitted, stop, dtype=torch.float64, device=mel.device)
        x = ((j + 0.5) * self.speed - 0.5).clamp(min=0)
        i0 = x.floor().long().clamp(max=total - 1)
        i1 = (i0 + 1).clamp(max=total - 1)
        lam = (x - i0).to(mel.dtype)
        f = self.frames
        out = f.index_select(2, i0 - self.base) * (1 - lam) + f.index_select(2, i1 - self.base) * lam
        self.emitted = stop
        # keep frames still needed by the next output frame
        keep_from = min(int(max((stop + 0.5) * self.speed - 0.5, 0)), total - 1)
        self.frames = self.frames[:, :, keep_from - self.base:]
        self.base = keep_from
        return out
