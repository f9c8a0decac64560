"""The two ONNX models of a model directory (speech tokenizer, CAM++), run through onnxruntime.

Like the official frontend, inputs are fed by position and their names read from the session (the real
files call them feats / feats_length and input), so any export with the same signature works.

Sessions: all graph optimisations, one inter-op thread, `threads` intra-op threads. One session serves
concurrent callers: `InferenceSession.run` is thread-safe. The speech tokenizer (the heavy one, a Whisper-size
encoder) runs on CUDA when this onnxruntime build has it, as in the official code; CAM++ stays on the CPU.
"""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch

from cosy.model.files import ModelDirError

log = logging.getLogger(__name__)
EMBED_DIM = 192
# CUDA provider: grow the arena only as needed (the flow and HiFT share the GPU), exhaustive cuDNN
# convolution search once per shape, copies on the compute stream
CUDA_OPTIONS = {"arena_extend_strategy": "kSameAsRequested", "cudnn_conv_algo_search": "EXHAUSTIVE",
                "do_copy_in_default_stream": True}
MAX_TOKENIZER_FRAMES = 3000  # 30 s of 100 Hz Whisper frames: the encoder's positional range


def default_threads() -> int:
    """Intra-op threads per session: half of this process's torch threads (a frontend worker's share of the
    cores; the rest run torch features and other requests), 1-4."""
    return max(1, min(4, torch.get_num_threads() // 2))


def _session(path: Path, threads: int, providers: list[str], gpu: int = 0) -> ort.InferenceSession:
    """An ORT session on the first of `providers` this build has; CUDA on device index `gpu`."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3  # errors only: the real files make ORT warn about unused initialisers
    available = set(ort.get_available_providers())
    chosen = [p for p in providers if p in available] or ["CPUExecutionProvider"]
    want_cuda = "CUDAExecutionProvider" in providers and torch.cuda.is_available()
    if want_cuda and "CUDAExecutionProvider" not in available:
        log.warning("%s runs on the CPU: a CUDA GPU is there but this onnxruntime has no CUDA provider "
                    "(install onnxruntime-gpu instead of onnxruntime: requirements/frontend-gpu.txt)", path.name)
    if not path.is_file():
        raise ModelDirError(f"{path} is missing: the model directory needs it")
    with_options = [(p, {**CUDA_OPTIONS, "device_id": gpu}) if p == "CUDAExecutionProvider" else p for p in chosen]
    try:
        session = ort.InferenceSession(str(path), sess_options=opts, providers=with_options)
    except Exception as e:  # InvalidProtobuf, truncated file, unsupported op ...
        raise ModelDirError(f"{path} is corrupt or not an ONNX model onnxruntime can load "
                            f"({type(e).__name__}: {e})") from None
    if "CUDAExecutionProvider" in chosen and "CUDAExecutionProvider" not in session.get_providers():
        # onnxruntime-gpu falls back to the CPU silently when CUDA/cuDNN libraries fail to load
        log.warning("%s runs on the CPU: onnxruntime's CUDA provider failed to start (CUDA 12 / cuDNN 9 "
                    "libraries missing or mismatched?); providers in use: %s", path.name, session.get_providers())
    return session


class SpeechTokenizer:
    """speech_tokenizer_v2.onnx (v3 alike): Whisper log-mel (1, 128, F) -> speech tokens (1, ceil(F / 4)) int32.

    classes: the number of speech tokens it may emit (the family's `tokens.size`, 6561). gpu: the CUDA device
    index when onnxruntime has CUDA (a worker on cuda:1 keeps its tokenizer there too).
    """

    def __init__(self, path: str | Path, classes: int, threads: int | None = None, gpu: int = 0):
        self.path, self.classes = Path(path), classes
        self.session = _session(self.path, threads or default_threads(),
                                ["CUDAExecutionProvider", "CPUExecutionProvider"], gpu)
        inputs = self.session.get_inputs()
        if len(inputs) != 2:
            raise ModelDirError(f"{self.path} does not look like a speech tokenizer: it takes {len(inputs)} "
                                f"inputs (expected log-mel and its length)")
        self.feats_name, self.length_name = inputs[0].name, inputs[1].name

    def __call__(self, log_mel: torch.Tensor) -> torch.Tensor:
        """log_mel (1, 128, F) float32 -> tokens (1, T) int32 in 0..classes - 1."""
        if log_mel.dim() != 3 or log_mel.shape[0] != 1 or log_mel.shape[1] != 128:
            raise ValueError(f"speech tokenizer input must be (1, 128, F), got {tuple(log_mel.shape)}")
        frames = log_mel.shape[2]
        if frames > MAX_TOKENIZER_FRAMES:
            raise ValueError(f"speech tokenizer input of {frames} frames exceeds 30 s ({MAX_TOKENIZER_FRAMES})")
        feats = np.ascontiguousarray(log_mel.detach().to(torch.float32).cpu().numpy())
        out = self.session.run(None, {self.feats_name: feats,
                                      self.length_name: np.array([frames], dtype=np.int32)})[0]
        # Exports differ in output rank ((1, T) or (1, 1, T)) and integer width; the official code flattens.
        tokens = torch.from_numpy(np.asarray(out).reshape(1, -1).astype(np.int32))
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.classes):
            raise ModelDirError(f"{self.path} returned token ids outside 0..{self.classes - 1}")
        return tokens


class SpeakerEmbedder:
    """campplus.onnx: mean-normalised Kaldi fbank (T, 80) -> speaker embedding (1, 192) float32."""

    def __init__(self, path: str | Path, threads: int | None = None):
        self.path = Path(path)
        self.session = _session(self.path, threads or default_threads(), ["CPUExecutionProvider"])
        inputs = self.session.get_inputs()
        if len(inputs) != 1:
            raise ModelDirError(f"{self.path} does not look like CAM++: it takes {len(inputs)} inputs (expected 1)")
        self.input_name = inputs[0].name

    def __call__(self, fbank: torch.Tensor) -> torch.Tensor:
        """fbank (T, 80) or (1, T, 80) float32 -> (1, 192) float32."""
        if fbank.dim() == 2:
            fbank = fbank.unsqueeze(0)
        if fbank.dim() != 3 or fbank.shape[0] != 1 or fbank.shape[2] != 80:
            raise ValueError(f"CAM++ input must be (T, 80) or (1, T, 80), got {tuple(fbank.shape)}")
        feats = np.ascontiguousarray(fbank.detach().to(torch.float32).cpu().numpy())
        out = np.asarray(self.session.run(None, {self.input_name: feats})[0], dtype=np.float32)
        if out.size != EMBED_DIM:
            raise ModelDirError(f"{self.path} returned {out.size} values; a CAM++ embedding has {EMBED_DIM}")
        return torch.from_numpy(out.reshape(1, EMBED_DIM).copy())
