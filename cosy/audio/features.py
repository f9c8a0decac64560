"""The three prompt features of CosyVoice2, over torch (no torchaudio, librosa or whisper at run time).

* `whisper_log_mel`: input of `speech_tokenizer_v2.onnx`, openai-whisper's `log_mel_spectrogram(n_mels=128)`.
* `kaldi_fbank`: input of `campplus.onnx`, Kaldi fbank (torchaudio `compliance.kaldi.fbank` settings of the
  official frontend) minus its mean over time; computed by `kaldi-native-fbank`, Kaldi's own C++ code.
* `flow_mel`: the flow's prompt mel, Matcha-TTS `mel_spectrogram` with the CosyVoice2 yaml's settings.

Both mel filter banks are librosa's `filters.mel` (Slaney scale, Slaney area normalisation), rebuilt here
from the published formula.
"""
from __future__ import annotations

import math
from functools import lru_cache

import kaldi_native_fbank as knf
import numpy as np
import torch
import torch.nn.functional as F

WHISPER_N_FFT, WHISPER_HOP, WHISPER_MELS = 400, 160, 128
FLOW_SR, FLOW_N_FFT, FLOW_HOP, FLOW_MELS, FLOW_FMAX = 24000, 1920, 480, 80, 8000.0
FBANK_MELS = 80


def _hz_to_slaney_mel(hz: torch.Tensor) -> torch.Tensor:
    """Slaney's Auditory Toolbox scale: linear (3 mel per 200 Hz) below 1 kHz, logarithmic above."""
    f_sp, min_log_hz, min_log_mel, logstep = 200.0 / 3, 1000.0, 15.0, math.log(6.4) / 27.0
    return torch.where(hz >= min_log_hz, min_log_mel + torch.log(hz.clamp(min=1e-10) / min_log_hz) / logstep,
                       hz / f_sp)


def _slaney_mel_to_hz(mel: torch.Tensor) -> torch.Tensor:
    f_sp, min_log_hz, min_log_mel, logstep = 200.0 / 3, 1000.0, 15.0, math.log(6.4) / 27.0
    return torch.where(mel >= min_log_mel, min_log_hz * torch.exp(logstep * (mel - min_log_mel)), f_sp * mel)


@lru_cache(maxsize=8)
def mel_filters(sr: int, n_fft: int, n_mels: int, fmin: float = 0.0, fmax: float | None = None) -> torch.Tensor:
    """Triangular Slaney mel filters (n_mels, n_fft // 2 + 1) float32, as librosa.filters.mel (htk=False).

    Built in float64: band edges equally spaced on the Slaney mel scale from fmin to fmax (default sr/2);
    each triangle is divided by its width in Hz / 2 so that every filter has unit area.
    """
    fmax = sr / 2 if fmax is None else fmax
    fft_hz = torch.linspace(0, sr / 2, n_fft // 2 + 1, dtype=torch.float64)
    lo, hi = _hz_to_slaney_mel(torch.tensor([fmin, fmax], dtype=torch.float64))
    edges = _slaney_mel_to_hz(torch.linspace(float(lo), float(hi), n_mels + 2, dtype=torch.float64))
    width = edges.diff()  # (n_mels + 1,)
    ramps = edges[:, None] - fft_hz[None, :]  # (n_mels + 2, n_freq)
    rising = -ramps[:-2] / width[:-1, None]
    falling = ramps[2:] / width[1:, None]
    weights = torch.clamp(torch.minimum(rising, falling), min=0)
    weights = weights * (2.0 / (edges[2:] - edges[:-2]))[:, None]
    return weights.to(torch.float32)


@lru_cache(maxsize=4)
def _hann(n: int) -> torch.Tensor:
    return torch.hann_window(n, periodic=True, dtype=torch.float32)


def whisper_log_mel(wav16k: torch.Tensor) -> torch.Tensor:
    """Whisper log-mel: 16 kHz wav (1, N) -> (1, 128, N // 160) float32, values in about [-1, 2].

    Centred STFT (reflect pad 200), n_fft 400, hop 160, periodic Hann; the last frame is dropped; power
    spectrum; 128 Slaney mels; log10 clamped at 1e-10; floored at (max - 8); then (x + 4) / 4.
    """
    x = wav16k.to(torch.float32).reshape(1, -1)
    if x.shape[-1] <= WHISPER_N_FFT // 2:
        raise ValueError(f"audio of {x.shape[-1]} samples is too short for the Whisper log-mel")
    spec = torch.stft(x, WHISPER_N_FFT, WHISPER_HOP, window=_hann(WHISPER_N_FFT).to(x.device), center=True,
                      pad_mode="reflect", return_complex=True)
    power = spec[..., :-1].abs() ** 2
    mel = mel_filters(16000, WHISPER_N_FFT, WHISPER_MELS).to(x.device) @ power
    log_spec = torch.clamp(mel, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return (log_spec + 4.0) / 4.0


def _fbank_options() -> knf.FbankOptions:
    """The official `kaldi.fbank(num_mel_bins=80, dither=0, sample_frequency=16000)`; the rest are Kaldi
    defaults: 25 ms povey window, 10 ms shift, snip_edges, DC removal, pre-emphasis 0.97, 512-point FFT,
    power spectrum, mel bins 20 Hz..Nyquist, log floored at float32 epsilon, no energy term."""
    opts = knf.FbankOptions()
    opts.frame_opts.samp_freq = 16000
    opts.frame_opts.dither = 0.0
    opts.frame_opts.frame_length_ms = 25.0
    opts.frame_opts.frame_shift_ms = 10.0
    opts.frame_opts.window_type = "povey"
    opts.frame_opts.snip_edges = True
    opts.frame_opts.remove_dc_offset = True
    opts.frame_opts.preemph_coeff = 0.97
    opts.frame_opts.round_to_power_of_two = True
    opts.mel_opts.num_bins = FBANK_MELS
    opts.mel_opts.low_freq = 20.0
    opts.mel_opts.high_freq = 0.0
    opts.use_energy = False
    opts.use_log_fbank = True
    opts.use_power = True
    return opts


def kaldi_fbank(wav16k: torch.Tensor) -> torch.Tensor:
    """CAM++ input: 16 kHz wav (1, N) -> (T, 80) float32 log fbank minus its mean over time.

    T = 1 + (N - 400) // 160 (snip_edges). The waveform is used as is, in [-1, 1], like the official
    frontend (Kaldi tools would scale to the int16 range; after mean removal that only moves the log floor).
    """
    x = wav16k.detach().to(torch.float32).reshape(-1).cpu().numpy()
    if x.shape[0] < 400:
        raise ValueError(f"audio of {x.shape[0]} samples is too short for a 25 ms fbank frame")
    fbank = knf.OnlineFbank(_fbank_options())  # one per call: the object holds the stream's state
    fbank.accept_waveform(16000, x)
    fbank.input_finished()
    feats = np.stack([fbank.get_frame(i) for i in range(fbank.num_frames_ready)]).astype(np.float32)
    feats = torch.from_numpy(feats)
    return feats - feats.mean(dim=0, keepdim=True)


def flow_mel(wav24k: torch.Tensor, fmax: float | None = FLOW_FMAX) -> torch.Tensor:
    """Flow prompt mel: 24 kHz wav (1, N) -> (1, N // 480, 80) float32 natural-log mel at 50 Hz.

    Reflect pad (n_fft - hop) / 2 = 720 each side, uncentred STFT n_fft = win = 1920, hop 480, periodic
    Hann; magnitude sqrt(re^2 + im^2 + 1e-9); 80 Slaney mels over 0..fmax (the family's
    `prompt_mel_fmax`: CosyVoice2 8 kHz, CosyVoice3 None = 12 kHz); log(clamp(x, 1e-5)).
    """
    x = wav24k.to(torch.float32).reshape(1, -1)
    pad = (FLOW_N_FFT - FLOW_HOP) // 2
    if x.shape[-1] <= pad or x.shape[-1] < FLOW_HOP:
        raise ValueError(f"audio of {x.shape[-1]} samples is too short for the flow mel")
    x = F.pad(x.unsqueeze(1), (pad, pad), mode="reflect").squeeze(1)
    spec = torch.stft(x, FLOW_N_FFT, FLOW_HOP, win_length=FLOW_N_FFT, window=_hann(FLOW_N_FFT).to(x.device),
                      center=False, return_complex=True)
    mag = torch.sqrt(spec.real ** 2 + spec.imag ** 2 + 1e-9)
    mel = mel_filters(FLOW_SR, FLOW_N_FFT, FLOW_MELS, 0.0, fmax).to(x.device) @ mag
    return torch.log(torch.clamp(mel, min=1e-5)).transpose(1, 2)
