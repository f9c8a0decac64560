"""CosyVoice3's vocoder (official `CausalHiFTGenerator`): mel (B, 80, T) -> 24 kHz speech (B, T*480).

CosyVoice2's HiFT (`cosy.hift.generator`) made causal: every conv is left-padded except `conv_pre` and the
f0 predictor's first conv, which look a few frames to the right; upsampling is nearest x u followed by a
left-padded conv (no transposed convs); the source noise comes from fixed tables, so the output is
deterministic. Not final (streaming): the last f0_look_right mel frames are f0 context and the next
conv_pre_look_right frames conv_pre context, so (T - 8) * 480 samples come out; re-vocoding a longer
prefix reproduces them (the official streaming re-vocodes the whole cached mel, without crossfade).

Weight norm is folded at load (`fold_checkpoint`); the f0 predictor keeps float64 weights, as the
official runs it. Keeps no per-call state: concurrent requests may share one instance.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cosy.hift.causal_source import CausalSourceModule
from cosy.hift.config import CausalHiFTConfig
from cosy.hift.f0_predictor import CausalConvRNNF0Predictor
from cosy.hift.generator import Snake
from cosy.hift.weights import fold_weight_norm


class LeftPadConv1d(nn.Conv1d):
    """Stride-1 conv that sees only the past: (kernel - 1) * dilation zeros on the left."""

    def __init__(self, c_in: int, c_out: int, kernel_size: int, dilation: int = 1):
        super().__init__(c_in, c_out, kernel_size, dilation=dilation)

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(F.pad(x, ((self.kernel_size[0] - 1) * self.dilation[0], 0)))


class UpsampleConv1d(nn.Conv1d):
    """Nearest upsampling x stride, then a left-padded conv (official `CausalConv1dUpsample`)."""

    def __init__(self, c_in: int, c_out: int, kernel_size: int, stride: int):
        super().__init__(c_in, c_out, kernel_size)
        self.up = stride

    def forward(self, x: Tensor) -> Tensor:
        x = x.repeat_interleave(self.up, dim=2)
        return super().forward(F.pad(x, (self.kernel_size[0] - 1, 0)))


class DownsampleConv1d(nn.Conv1d):
    """Strided conv (kernel 2 * stride) after stride - 1 zeros on the left (official `CausalConv1dDownSample`)."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__(c_in, c_out, 2 * stride, stride)

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(F.pad(x, (self.stride[0] - 1, 0)))


class CausalResBlock(nn.Module):
    """Per dilation: x += conv2(snake(conv1_dilated(snake(x)))), all convs left-padded."""

    def __init__(self, channels: int, kernel_size: int, dilations: tuple[int, ...]):
        super().__init__()
        self.convs1 = nn.ModuleList(LeftPadConv1d(channels, channels, kernel_size, d) for d in dilations)
        self.convs2 = nn.ModuleList(LeftPadConv1d(channels, channels, kernel_size) for _ in dilations)
        self.activations1 = nn.ModuleList(Snake(channels) for _ in dilations)
        self.activations2 = nn.ModuleList(Snake(channels) for _ in dilations)

    def forward(self, x: Tensor) -> Tensor:
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, self.activations1, self.activations2):
            x = c2(a2(c1(a1(x)))) + x
        return x


class CausalHiFTGenerator(nn.Module):
    """Attribute names mirror the official state-dict keys (after weight-norm folding).

    noise_state: the torch generator state the source tables are drawn from; default: replayed from the
    yaml's sizes (`cosy.hift.noise_tables.state_before_source`), as the official construction leaves it.
    """

    def __init__(self, cfg: CausalHiFTConfig, noise_state: Tensor | None = None):
        super().__init__()
        self.cfg = cfg
        self.num_kernels = len(cfg.resblock_kernel_sizes)
        rates = cfg.upsample_rates
        ch = [cfg.base_channels // 2**i for i in range(len(rates) + 1)]
        with torch.random.fork_rng(devices=[]):  # init values are replaced at load; keep the caller's RNG
            self.m_source = CausalSourceModule(cfg, noise_state)
            self.conv_pre = nn.Conv1d(cfg.in_channels, ch[0], cfg.conv_pre_look_right + 1)  # right context
            self.ups = nn.ModuleList(UpsampleConv1d(ch[i], ch[i + 1], k, u)
                                     for i, (u, k) in enumerate(zip(rates, cfg.upsample_kernel_sizes)))
            # the source STFT (hop 4) down to each stage's rate: strides 15, 3, 1 for rates (8, 5, 3)
            strides = [math.prod(rates[i + 1:]) for i in range(len(rates))]
            self.source_downs = nn.ModuleList(LeftPadConv1d(cfg.stft_channels, ch[i + 1], 1) if u == 1
                                              else DownsampleConv1d(cfg.stft_channels, ch[i + 1], u)
                                              for i, u in enumerate(strides))
            self.source_resblocks = nn.ModuleList(
                CausalResBlock(ch[i + 1], k, d)
                for i, (k, d) in enumerate(zip(cfg.source_resblock_kernel_sizes, cfg.source_resblock_dilation_sizes)))
            self.resblocks = nn.ModuleList(CausalResBlock(ch[i + 1], k, d) for i in range(len(rates))
                                           for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes))
            self.conv_post = LeftPadConv1d(ch[-1], cfg.stft_channels, 7)
            self.f0_predictor = CausalConvRNNF0Predictor(cfg, cfg.f0_look_right)

    @staticmethod
    def fold_checkpoint(sd: dict[str, Tensor]) -> dict[str, Tensor]:
        """hift.pt (either weight-norm naming, optional `generator.` prefix) -> this module's state dict;
        the f0 predictor's weights are folded and kept in float64."""
        return fold_weight_norm(sd, float64_prefixes=("f0_predictor.",))

    @property
    def context_frames(self) -> int:
        """Mel frames at the end of a non-final call that produce no audio (f0 and conv_pre context: 7)."""
        return self.cfg.f0_look_right + self.cfg.conv_pre_look_right

    def _window(self, device: torch.device) -> Tensor:
        return torch.hann_window(self.cfg.istft_n_fft, periodic=True, dtype=torch.float64, device=device).float()

    @torch.no_grad()
    def predict_f0(self, mel: Tensor, finalize: bool = True) -> Tensor:
        """mel (B, 80, T) -> f0 (B, T [- f0_look_right if not final]) Hz, computed in float64, as mel's dtype."""
        return self.f0_predictor(mel, finalize).to(mel.dtype)

    @property
    def f0_context_frames(self) -> int:
        """Mel frames to the left that the f0 of a frame depends on (the four left-padded k3 convs: 8)."""
        return sum(conv.kernel_size[0] - 1 for conv in self.f0_predictor.condnet[2::2])

    @property
    def decode_context_frames(self) -> int:
        """Mel frames to the left that `decode`'s output at a frame depends on, rounded up, plus one. Per
        upsampling stage, in its steps: the further of its upsampling conv and the source branch added after
        it (the down conv's step back, the STFT window, the source resblock), then the widest resblock, then
        the reflect pad's one step; after the stages, conv_post (k7) and the iSTFT window."""
        cfg = self.cfg

        def reach(kernel: int, dilations: tuple[int, ...]) -> int:
            return (kernel - 1) * (sum(dilations) + len(dilations))

        frames, steps = 0.0, 1
        stft_frames = cfg.istft_n_fft // cfg.istft_hop_len  # a source STFT frame spans n_fft samples
        widest = max(reach(k, d) for k, d in zip(cfg.resblock_kernel_sizes, cfg.resblock_dilation_sizes))
        for i, (rate, kernel) in enumerate(zip(cfg.upsample_rates, cfg.upsample_kernel_sizes)):
            steps *= rate
            source = reach(cfg.source_resblock_kernel_sizes[i], cfg.source_resblock_dilation_sizes[i]) + 1 + stft_frames
            frames += (max(kernel - 1, source) + widest + 1) / steps
        frames += (7 - 1 + cfg.istft_n_fft) / (steps * cfg.istft_hop_len)
        return math.ceil(frames) + 1

    @torch.no_grad()
    def source(self, f0: Tensor, noise: bool = True, start: int = 0) -> Tensor:
        """f0 (B, T) Hz -> excitation (B, 1, (T - start)*480) float32 of frames start..T-1; `noise=False`
        takes the noise table as zeros."""
        return self.m_source(f0, noise=noise, start=start)

    @torch.no_grad()
    def decode(self, mel: Tensor, s: Tensor, finalize: bool = True) -> Tensor:
        """mel (B, 80, T), source s (B, 1, T*480) -> speech (B, T*480) clamped to +-audio_limit; not final:
        the last conv_pre_look_right frames are context only -> (B, (T - conv_pre_look_right - 1) * 480)."""
        cfg = self.cfg
        window = self._window(mel.device)
        spec = torch.view_as_real(torch.stft(s.squeeze(1).float(), cfg.istft_n_fft, cfg.istft_hop_len,
                                             cfg.istft_n_fft, window=window, return_complex=True))
        s_stft = torch.cat([spec[..., 0], spec[..., 1]], dim=1).to(mel.dtype)  # (B, n_fft+2, frames)
        if finalize:
            x = self.conv_pre(F.pad(mel, (0, cfg.conv_pre_look_right)))
        else:
            x = self.conv_pre(mel)
            s_stft = s_stft[:, :, :-math.prod(cfg.upsample_rates) * cfg.conv_pre_look_right]
        for i, up in enumerate(self.ups):
            x = up(F.leaky_relu(x, cfg.lrelu_slope))
            if i == len(self.ups) - 1:
                x = F.pad(x, (1, 0), mode="reflect")
            x = x + self.source_resblocks[i](self.source_downs[i](s_stft))
            blocks = self.resblocks[i * self.num_kernels:(i + 1) * self.num_kernels]
            xs = blocks[0](x)
            for block in blocks[1:]:
                xs = xs + block(x)
            x = xs / self.num_kernels
        x = self.conv_post(F.leaky_relu(x)).float()  # default slope 0.01, as the official

        n_bins = cfg.istft_n_fft // 2 + 1
        magnitude = torch.exp(x[:, :n_bins]).clamp(max=1e2)
        phase = torch.sin(x[:, n_bins:])
        spec = torch.complex(magnitude * torch.cos(phase), magnitude * torch.sin(phase))
        wav = torch.istft(spec, cfg.istft_n_fft, cfg.istft_hop_len, cfg.istft_n_fft, window=window)
        if not finalize:
            wav = wav[:, :-cfg.upsample_scale]
        return wav.clamp(-cfg.audio_limit, cfg.audio_limit)

    @torch.no_grad()
    def inference(self, mel: Tensor, finalize: bool = True, noise: bool = True,
                  generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """mel (B, 80, T) -> (speech (B, n), source (B, 1, m)): n = T*480 when final, (T - 8)*480 when not.

        `generator` is accepted for the vocoder interface and unused: the fixed tables make this vocoder
        deterministic. `noise=False` takes the tables as zeros (golden `inference_zero_tables`).
        """
        f0 = self.predict_f0(mel, finalize)
        s = self.source(f0, noise=noise)
        x = mel if finalize else mel[:, :, :-self.cfg.f0_look_right]
        return self.decode(x, s, finalize), s

    def forward(self, mel: Tensor, **kwargs) -> tuple[Tensor, Tensor]:
        """Same as `inference`."""
        return self.inference(mel, **kwargs)
