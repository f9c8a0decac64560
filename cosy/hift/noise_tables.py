"""The fixed noise tables of CosyVoice3's causal HiFT source, rebuilt exactly as the official code draws them.

The official `SineGen2(causal=True)` / `SourceModuleHnNSF(causal=True)` draw, at construction and from the
global torch CPU generator: `rand_ini = rand(1, 9)` (column 0 set to 0), `sine_waves = rand(1, 7.2 M, 9)`
(uniform additive noise, 300 s at 24 kHz), 9 + 1 uniforms for `l_linear`'s init, `uv = rand(1, 7.2 M, 1)`
(unused by inference). Every inference call then uses the first samples of `sine_waves`.

What the generator holds at that moment follows from the yaml: the CFM reseeds with 0 and draws its noise,
then the flow's token embedding (normal) and speaker projection (Linear init) and the f0 predictor (five
convs and a Linear) are built. `state_before_source` replays exactly those draws with a private generator
(checked against the states the golden fixtures recorded, for the tiny and the published sizes), so the
tables need nothing beyond the yaml. The caller's RNG is never touched.

Memory: the table is drawn lazily, up to the longest call so far (uniform draws fill a tensor in order, so
a prefix drawn alone equals the prefix of the whole table); the official keeps all 260 MB.
"""
from __future__ import annotations

import threading

import torch
from torch import Tensor

from cosy.hift.config import CausalHiFTConfig

MIN_ROWS = 10 * 24000  # first draw: 10 s of samples


def linear_init(g: torch.Generator, n_out: int, n_in: int) -> None:
    """The draws of nn.Linear / nn.Conv1d default init (kaiming_uniform_ weight, uniform_ bias): one per value."""
    torch.empty(n_out * n_in).uniform_(generator=g)
    torch.empty(n_out).uniform_(generator=g)


def state_before_source(cfg: CausalHiFTConfig) -> Tensor:
    """The torch CPU generator state (uint8) with which the official yaml reaches the HiFT source."""
    g = torch.Generator().manual_seed(0)  # the CFM's set_all_random_seed(0)
    torch.empty(1, cfg.flow_output_size, cfg.cfm_noise_frames).normal_(generator=g)  # CFM rand_noise
    torch.empty(cfg.flow_vocab_size, cfg.flow_input_size).normal_(generator=g)  # flow input_embedding
    linear_init(g, cfg.flow_output_size, cfg.flow_spk_embed_dim)  # flow spk_embed_affine_layer
    c = cfg.f0_cond_channels
    linear_init(g, c, cfg.f0_in_channels * (cfg.f0_look_right + 1))  # f0 condnet.0 (weight norm draws nothing)
    for _ in range(4):
        linear_init(g, c, c * 3)  # condnet.2 .. condnet.8
    linear_init(g, cfg.f0_num_class, c)  # classifier
    return g.get_state()


class NoiseTables:
    """`rand_ini` (1, H+1) and the additive noise table `sine_waves(n)` -> (1, n, H+1), drawn on demand.

    Thread-safe; returned tensors are shared and read-only.
    """

    def __init__(self, state: Tensor, n_sines: int, max_samples: int):
        self.n_sines, self.max_samples = n_sines, max_samples
        g = torch.Generator()
        g.set_state(state)
        rand_ini = torch.rand(1, n_sines, generator=g)
        rand_ini[:, 0] = 0
        self.rand_ini = rand_ini
        self._state_after_ini = g.get_state()
        self._table = torch.zeros(1, 0, n_sines)
        self._lock = threading.RLock()
        self._on_device: dict[torch.device, Tensor] = {}

    def sine_waves(self, n: int, device: torch.device | str = "cpu") -> Tensor:
        """The first n rows of the official `sine_waves` table (float32) on `device` (a copy per device is
        kept, grown with the CPU table, so calls do not copy from the host each time)."""
        device = torch.device(device)
        if device.type != "cpu":
            with self._lock:
                cached = self._on_device.get(device)
                if cached is None or cached.size(1) < n:
                    self.sine_waves(n)  # grows the CPU table to >= n rows
                    cached = self._on_device[device] = self._table.to(device)
            return cached[:, :n]
        if n > self.max_samples:
            raise ValueError(f"{n} samples exceed the HiFT noise table ({self.max_samples} samples, "
                             f"{self.max_samples // 24000} s at 24 kHz): synthesise shorter segments")
        table = self._table
        if table.size(1) < n:
            with self._lock:
                if self._table.size(1) < n:
                    rows = min(self.max_samples, max(n, 2 * self._table.size(1), MIN_ROWS))
                    g = torch.Generator()
                    g.set_state(self._state_after_ini)
                    self._table = torch.rand(1, rows, self.n_sines, generator=g)
                table = self._table
        return table[:, :n]
