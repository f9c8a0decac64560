"""HiFT vocoder (official `HiFTGenerator`): mel (B, 80, T) -> 24 kHz waveform (B, T*480).

Neural source filter + iSTFTNet: an f0 predictor drives a harmonic source; the STFT of that source is fused
into a HiFi-GAN upsampler at each scale, whose output is a magnitude/phase spectrogram for an iSTFT.
Convs are plain here: the checkpoint's weight norm is folded at load (`cosy.hift.weights`). The module
keeps no per-call state, so concurrent requests may share it.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from cosy.hift.config import HiFTConfig
from cosy.hift.f0_predictor import ConvRNNF0Predictor
from cosy.hift.source import SourceModuleHnNSF
from cosy.hift.weights import fold_weight_norm


class Snake(nn.Module):
    """x + sin^2(alpha x) / alpha, alpha per channel (linear scale, as in the official checkpoints)."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha[None, :, None]
        return x + (1.0 / (alpha + 1e-9)) * torch.sin(x * alpha).pow(2)


class ResBlock(nn.Module):
    """HiFi-GAN/BigVGAN residual block: per dilation, x += conv2(snake(conv1_dilated(snake(x))))."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]):
        super().__init__()
        self.convs1 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, dilation=d, padding=d * (kernel_size - 1) // 2)
            for d in dilations
        )
        self.convs2 = nn.ModuleList(
            nn.Conv1d(channels, channels, kernel_size, padding=(kernel_size - 1) // 2) for _ in dilations
        )
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            x = c2(a2(c1(a1(x)))) + x
        return x


class HiFTGenerator(nn.Module):
    """Attribute names mirror the official state-dict keys (after weight-norm folding)."""

    def __init__(self, cfg: HiFTConfig):
        super().__init__()
        self.cfg = cfg
        self.num_kernels = len(cfg.resblock_kernel_sizes)
        base = cfg.base_channels
        ch = [base // 2**i for i in range(len(cfg.upsample_rates) + 1)]  # channels before/after each stage

        self.m_source = SourceModuleHnNSF(cfg)
        self.conv_pre = nn.Conv1d(cfg.in_channels, base, 7, padding=3)
        self.ups = nn.ModuleList(
            nn.ConvTranspose1d(ch[i], ch[i + 1], k, u, padding=(k - u) // 2)
            for i, (u, k) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes))
        )
        # The source STFT (hop 4) is brought down to each stage's rate: strides 15, 3, 1 for rates (8, 5, 3).
        rates = cfg.upsample_rates
        strides = [math.prod(rates[i + 1:]) for i in range(len(rates))]
        self.source_downs = nn.ModuleList(
            nn.Conv1d(cfg.stft_channels, ch[i + 1], 1) if u == 1
            else nn.Conv1d(cfg.stft_channels, ch[i + 1], 2 * u, u, padding=u // 2)
            for i, u in enumerate(strides)
        )
        self.source_resblocks = nn.ModuleList(
            ResBlock(ch[i + 1], k, d)
            for i, (k, d) in enumerate(zip(cfg.source_resblock_kernel_sizes, cfg.source_resblock_dilation_sizes))
        )
        self.resblocks = nn.ModuleList(
            ResBlock(ch[i + 1], k, d)
            for i in range(len(rates))
            for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes)
        )
        self.conv_post = nn.Conv1d(ch[-1], cfg.stft_channels, 7, padding=3)
        self.f0_predictor = ConvRNNF0Predictor(cfg)

    @staticmethod
    def fold_checkpoint(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """hift.pt (either weight-norm naming, optional `generator.` prefix) -> this module's state dict."""
        return fold_weight_norm(sd)

    # -- pieces --------------------------------------------------------------------------------------------

    def _window(self, device: torch.device) -> torch.Tensor:
        # Periodic Hann built in float64 then rounded: bit-identical to the official scipy window.
        return torch.hann_window(self.cfg.istft_n_fft, periodic=True, dtype=torch.float64, device=device).float()

    @torch.no_grad()
    def predict_f0(self, mel: torch.Tensor) -> torch.Tensor:
        """mel (B, 80, T) -> f0 (B, T) in Hz."""
        return self.f0_predictor(mel)

    @torch.no_grad()
    def source(
        self, f0: torch.Tensor, generator: torch.Generator | None = None, noise: bool = True
    ) -> torch.Tensor:
        """f0 (B, T) Hz -> excitation s (B, 1, T*480), float32. See `cosy.hift.source` for the randomness."""
        return self.m_source(f0, generator=generator, noise=noise)

    @torch.no_grad()
    def decode(self, mel: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """mel (B, 80, T), source s (B, 1, T*480) -> speech (B, T*480), clamped to +-audio_limit."""
        cfg = self.cfg
        window = self._window(mel.device)
        spec = torch.stft(s.squeeze(1).float(), cfg.istft_n_fft, cfg.istft_hop_len, cfg.istft_n_fft,
                          window=window, return_complex=True)
        spec = torch.view_as_real(spec)  # (B, n_fft/2+1, frames, 2)
        s_stft = torch.cat([spec[..., 0], spec[..., 1]], dim=1).to(mel.dtype)  # (B, n_fft+2, frames)

        x = self.conv_pre(mel)
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, cfg.lrelu_slope))
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")  # one frame short of the STFT's frame count
            x = x + self.source_resblocks[i](self.source_downs[i](s_stft))
            blocks = self.resblocks[i * self.num_kernels:(i + 1) * self.num_kernels]
            xs = blocks[0](x)
            for block in blocks[1:]:
                xs = xs + block(x)
            x = xs / self.num_kernels
        x = self.conv_post(F.leaky_relu(x)).float()  # default slope 0.01 here, as in the official

        n_bins = cfg.istft_n_fft // 2 + 1
        magnitude = torch.exp(x[:, :n_bins]).clamp(max=1e2)
        phase = torch.sin(x[:, n_bins:])  # the official's sin; kept for identical numbers
        spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        wav = torch.istft(spec, cfg.istft_n_fft, cfg.istft_hop_len, cfg.istft_n_fft, window=window)
        return wav.clamp(-cfg.audio_limit, cfg.audio_limit)

    # -- full pass -----------------------------------------------------------------------------------------

    @torch.no_grad()
    def inference(
        self,
        mel: torch.Tensor,
        cache_source: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        noise: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """mel (B, 80, T) -> (speech (B, T*480), source s (B, 1, T*480)).

        `cache_source` (B, 1, L): the previous chunk's source tail; it overwrites s[:, :, :L] so that
        streamed chunks join without a phase jump (official behaviour).
        """
        s = self.source(self.predict_f0(mel), generator=generator, noise=noise)
        if cache_source is not None and cache_source.shape[2] > 0:
            s[:, :, :cache_source.shape[2]] = cache_source
        return self.decode(mel, s), s

    @torch.no_grad()
    def inference_rows(self, mel: torch.Tensor, cache_sources: list[torch.Tensor | None],
                       generators: list[torch.Generator]) -> tuple[torch.Tensor, torch.Tensor]:
        """Several requests' chunks of equal length as one batch: mel (B, 80, T) -> (speech (B, T*480),
        source (B, 1, T*480)). Row i equals `inference(mel[i:i+1], cache_sources[i], generators[i])` to float
        rounding: the f0 predictor and the decoder run batched, the source draws its randomness per row
        from that row's own generator (the same draws as the solo call) and takes that row's cache."""
        f0 = self.predict_f0(mel)
        s = torch.cat([self.source(f0[i:i + 1], generator=g) for i, g in enumerate(generators)])
        for i, cache in enumerate(cache_sources):
            if cache is not None and cache.shape[2] > 0:
                s[i:i + 1, :, :cache.shape[2]] = cache
        return self.decode(mel, s), s

    def forward(self, mel: torch.Tensor, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Same as `inference`."""
        return self.inference(mel, **kwargs)
