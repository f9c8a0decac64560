"""Conditional flow matching sampler: official `CausalConditionalCFM` (inference only).

Euler integration of dx/dt = v(x, t) from fixed noise (t=0) to mel (t=1) on a cosine time schedule, with
classifier-free guidance computed as one batch of two (conditioned, unconditioned).
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from cosy.flow.config import CFMConfig, EstimatorConfig
from cosy.preemption import preemption_point


def fixed_noise(seed: int, n_mels: int, frames: int) -> Tensor:
    """(1, n_mels, frames) float32 on CPU, equal to `torch.manual_seed(seed); torch.randn(1, n_mels, frames)`,
    drawn from a private generator so the caller's global RNG is left alone."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(1, n_mels, frames, generator=gen, device="cpu", dtype=torch.float32)


class CausalConditionalCFM(nn.Module):
    """Holds the estimator (key prefix `estimator.`) and the fixed starting noise (not in the state dict).

    estimator: builds the velocity estimator v(x, mu, t, spks, cond, streaming) from `estimator_cfg`
    (the model family's `flow_estimator`; CosyVoice2: the U-Net `CausalConditionalDecoder`).
    """

    def __init__(self, cfg: CFMConfig, estimator_cfg: EstimatorConfig,
                 estimator: Callable[[EstimatorConfig], nn.Module]):
        super().__init__()
        self.cfg = cfg
        self.estimator = estimator(estimator_cfg)
        # The official model draws this once at construction; every call starts from its first T frames, so a
        # re-run of a longer prefix (streaming) reproduces earlier frames. Read-only after init.
        self.register_buffer("rand_noise", fixed_noise(cfg.noise_seed, estimator_cfg.out_channels, cfg.noise_frames),
                             persistent=False)

    @property
    def estimator_dtype(self) -> torch.dtype:
        """The estimator's parameter dtype (`--dtype`); the ODE state and times stay float32."""
        return next(self.estimator.parameters()).dtype

    def time_span(self, device: torch.device, dtype: torch.dtype) -> Tensor:
        """(n_timesteps + 1,) times from 0 to 1."""
        t = torch.linspace(0, 1, self.cfg.n_timesteps + 1, device=device, dtype=dtype)
        if self.cfg.t_scheduler == "cosine":
            t = 1 - torch.cos(t * 0.5 * math.pi)
        return t

    @torch.inference_mode()
    def forward(self, mu: Tensor, spks: Tensor, cond: Tensor, streaming: bool = False,
                lengths: Tensor | None = None) -> Tensor:
        """Sample a mel.

        Args:
            mu: (1, 80, T) encoder output.  spks: (1, 80) projected speaker embedding.
            cond: (1, 80, T) prompt mel in the first frames, zeros after.
            streaming: chunk attention in the estimator.
            lengths: (B,) valid frames per row when mu/spks/cond are a right-padded batch of B utterances
                (B, 80, T); each row then starts from the same noise slice from frame 0 as solo, and its valid
                frames equal its solo result (padded frames come back as zeros).
        Returns:
            (B, 80, T) float32.
        """
        n = mu.size(2)
        if n > self.rand_noise.size(2):
            raise ValueError(f"flow input of {n} frames exceeds the fixed noise ({self.rand_noise.size(2)} frames)")
        b = mu.size(0)
        # the ODE state and time steps stay float32 when the estimator runs in half precision
        x = self.rand_noise[:, :, :n].to(device=mu.device, dtype=torch.float32).expand(b, -1, -1)
        extra = {}
        if lengths is not None:
            valid = torch.arange(n, device=mu.device).unsqueeze(0) < lengths.to(mu.device).unsqueeze(1)
            x = x * valid.unsqueeze(1).to(x.dtype)
            extra["lengths"] = torch.cat([lengths, lengths]).to(mu.device)
        t_span = self.time_span(mu.device, torch.float32)
        rate = self.cfg.inference_cfg_rate

        # CFG batch: rows [:B] conditioned, rows [B:] with mu, spks and cond zeroed; in the estimator's dtype
        dtype = self.estimator_dtype
        mu_in = torch.cat([mu, torch.zeros_like(mu)]).to(dtype)
        spks_in = torch.cat([spks, torch.zeros_like(spks)]).to(dtype)
        cond_in = torch.cat([cond, torch.zeros_like(cond)]).to(dtype)

        # Same accumulation as the official solver: t advances by dt, dt is re-derived from t_span.
        t, dt = t_span[0], t_span[1] - t_span[0]
        for step in range(1, len(t_span)):
            v = self.estimator(torch.cat([x, x]).to(dtype), mu_in, t.expand(2 * b), spks_in, cond_in,
                               streaming, **extra).float()
            v_cond, v_uncond = v[:b], v[b:]
            x = x + dt * ((1.0 + rate) * v_cond - rate * v_uncond)
            t = t + dt
            if step < len(t_span) - 1:
                dt = t_span[step + 1] - t
                preemption_point()  # more urgent work (a listener's chunk) may run between two steps
        return x.float()
