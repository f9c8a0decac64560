"""Prompt audio: reading and checking (io), resampling, and the three feature extractors (features)."""
from cosy.audio.features import flow_mel, kaldi_fbank, mel_filters, whisper_log_mel
from cosy.audio.io import (
                           MAX_PROMPT_SECONDS,
                           MIN_PROMPT_SAMPLE_RATE,
                           MIN_PROMPT_SECONDS,
                           AudioError,
                           check_prompt,
                           load_audio,
                           load_prompt,
                           load_prompt_wav,
)
from cosy.audio.resample import resample

__all__ = ["AudioError", "MAX_PROMPT_SECONDS", "MIN_PROMPT_SAMPLE_RATE", "MIN_PROMPT_SECONDS", "check_prompt",
           "flow_mel", "kaldi_fbank", "load_audio", "load_prompt", "load_prompt_wav", "mel_filters", "resample",
           "whisper_log_mel"]
