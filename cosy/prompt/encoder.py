"""Voice prompt -> what the LM and flow need of it: speech tokens, aligned flow mel, speaker embedding.

Follows the official `frontend_zero_shot` for CosyVoice2 (24 kHz): the prompt is read once, resampled to
16 kHz (speech tokenizer, CAM++) and to 24 kHz (flow mel), and the mel and tokens are cut to a common length
at exactly 2 mel frames per token:

    token_len = min(mel_frames // 2, n_tokens);  mel = mel[:, :2 * token_len];  tokens = tokens[:, :token_len]

One encoder serves concurrent requests: it holds only the two read-only ONNX sessions.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cosy.audio.features import flow_mel, kaldi_fbank, whisper_log_mel
from cosy.audio.io import MAX_PROMPT_SECONDS, AudioError, AudioSource, load_prompt
from cosy.audio.resample import resample
from cosy.model.family import ModelFamily
from cosy.model.files import ModelDir
from cosy.prompt.onnx_models import SpeakerEmbedder, SpeechTokenizer

TOKENIZER_SR = 16000
FLOW_SR = 24000
MEL_FRAMES_PER_TOKEN = 2


@dataclass
class PromptFeatures:
    """Everything a voice prompt contributes to synthesis (CPU tensors)."""

    speech_tokens: torch.Tensor  # (1, Tp) int32, 25 Hz, ids 0..family.tokens.size - 1 (6560)
    mel: torch.Tensor  # (1, 2*Tp, 80) float32, 50 Hz natural-log mel, aligned to the tokens
    embedding: torch.Tensor  # (1, 192) float32 CAM++ speaker embedding

    def check(self) -> "PromptFeatures":
        """Itself; ValueError naming the first tensor whose shape, dtype or values are not the ones above (a
        stored voice damaged on disk, or written by something else)."""
        t, m, e = self.speech_tokens, self.mel, self.embedding
        if t.dim() != 2 or t.shape[0] != 1 or t.shape[1] == 0 or t.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"speech_tokens must be (1, T>0) ints, not {tuple(t.shape)} {t.dtype}")
        if int(t.min()) < 0:
            raise ValueError(f"speech_tokens must be ids >= 0, not {int(t.min())}")
        if m.dim() != 3 or m.shape[0] != 1 or m.shape[2] != 80 or m.shape[1] != MEL_FRAMES_PER_TOKEN * t.shape[1] \
                or not m.is_floating_point() or not bool(torch.isfinite(m).all()):
            raise ValueError(f"mel must be (1, {MEL_FRAMES_PER_TOKEN * t.shape[1]}, 80) finite floats for "
                             f"{t.shape[1]} speech tokens, not {tuple(m.shape)} {m.dtype}")
        if tuple(e.shape) != (1, 192) or not e.is_floating_point() or not bool(torch.isfinite(e).all()):
            raise ValueError(f"embedding must be (1, 192) finite floats, not {tuple(e.shape)} {e.dtype}")
        return self

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens, mel, embedding) as numpy arrays: what crosses a process boundary."""
        return self.speech_tokens.numpy(), self.mel.numpy(), self.embedding.numpy()

    @classmethod
    def from_arrays(cls, arrays: tuple[np.ndarray, np.ndarray, np.ndarray]) -> "PromptFeatures":
        return cls(*(torch.from_numpy(np.asarray(a)) for a in arrays))


def align(tokens: torch.Tensor, mel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Official rule: cut tokens (1, T) and mel (1, F, 80) to token_len = min(F // 2, T) and 2 * token_len."""
    token_len = min(mel.shape[1] // MEL_FRAMES_PER_TOKEN, tokens.shape[1])
    return tokens[:, :token_len], mel[:, :MEL_FRAMES_PER_TOKEN * token_len]


class VoicePromptEncoder:
    """Opens the family's speech tokenizer (`<model_dir>/speech_tokenizer_v2.onnx`) and `<model_dir>/campplus.onnx`;
    encodes prompts.

    family: the model family (default: detected from the directory's yaml; pass it for a directory that
    holds only the ONNX files). threads: intra-op threads of each ONNX session (default: half of this
    process's torch threads, 1 to 4: `cosy.prompt.onnx_models.default_threads`).
    gpu: the CUDA device index the speech tokenizer uses when onnxruntime has CUDA (the worker's GPU).
    """

    def __init__(self, model_dir: str | Path | ModelDir, threads: int | None = None,
                 family: ModelFamily | None = None, gpu: int = 0):
        md = model_dir if isinstance(model_dir, ModelDir) else ModelDir(model_dir, family)
        self.model_dir, self.family = md.path, md.family
        files = self.family.files
        self.tokenizer = SpeechTokenizer(self.model_dir / files.speech_tokenizer, self.family.tokens.size, threads,
                                         gpu=gpu)
        self.embedder = SpeakerEmbedder(self.model_dir / files.campplus, threads)

    def speech_tokens(self, wav16k: torch.Tensor) -> torch.Tensor:
        """16 kHz wav (1, N), at most 30 s -> speech tokens (1, ceil(N // 160 / 4)) int32."""
        if wav16k.shape[-1] > MAX_PROMPT_SECONDS * TOKENIZER_SR:
            raise AudioError(f"prompt audio is {wav16k.shape[-1] / TOKENIZER_SR:.1f} s; the speech tokenizer "
                             f"takes at most {MAX_PROMPT_SECONDS:g} s")
        return self.tokenizer(whisper_log_mel(wav16k))

    def speaker_embedding(self, wav16k: torch.Tensor) -> torch.Tensor:
        """16 kHz wav (1, N) -> CAM++ embedding (1, 192) float32."""
        return self.embedder(kaldi_fbank(wav16k))

    def encode(self, source: AudioSource) -> PromptFeatures:
        """Prompt audio (path, file bytes or (array, rate)) -> aligned PromptFeatures. Raises AudioError."""
        wav, sr = load_prompt(source)
        wav16k = resample(wav, sr, TOKENIZER_SR).unsqueeze(0)
        wav24k = resample(wav, sr, FLOW_SR).unsqueeze(0)
        tokens = self.speech_tokens(wav16k)
        embedding = self.speaker_embedding(wav16k)
        tokens, mel = align(tokens, flow_mel(wav24k, self.family.prompt_mel_fmax))
        return PromptFeatures(speech_tokens=tokens.contiguous(), mel=mel.contiguous(), embedding=embedding)
