"""Small random stand-ins for the two ONNX files of a model directory, with the official signatures.

The published files cannot be downloaded where we test, so the builder writes these instead. They are
built node by node with `onnx.helper` (no torch exporter) and keep exactly what a caller can observe:

`speech_tokenizer_v2.onnx` (S3 tokenizer v2, ~500 MB when real):
    inputs  feats (B, 128, T) float32 Whisper log-mel, feats_length (B,) int32
    output  indices (B, ceil(T / 4)) int32, speech token ids in 0..6560 (3^8 FSQ codes), 25 Hz
  The real encoder subsamples twice with stride-2 convs (kernel 3, padding 1), so it gives ceil(ceil(T/2)/2)
  = ceil(T/4) tokens. The stand-in: frames past feats_length are zeroed, a stride-4 conv (right pad 3, also
  ceil(T/4) outputs), tanh, a projection to 6561 classes and ArgMax.

`campplus.onnx` (CAM++ speaker verification, ~28 MB when real):
    input   input (B, T, 80) float32 mean-normalised Kaldi fbank
    output  output (B, 192) float32 speaker embedding
  The stand-in: a frame-wise projection, tanh (a linear map of a zero-mean input would average to its bias),
  mean over time, a projection to 192.

Opset 17 and IR version 8 so that onnxruntime releases back to 1.14 (the official pin is 1.18) load them.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from cosy.model.families.cosyvoice2 import FAMILY

SPEECH_TOKEN_CLASSES = FAMILY.tokens.size  # 3^8
TOKENIZER_MELS = 128
TOKENIZER_STRIDE = 4  # 100 Hz mel frames -> 25 Hz tokens
FBANK_DIM = 80
EMBED_DIM = 192
_OPSET = 17
_IR_VERSION = 8
_HIDDEN = 32


def _save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.checker.check_model(model)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    onnx.save_model(model, str(tmp))
    os.replace(tmp, path)
    return path


def _model(graph: onnx.GraphProto, doc: str) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="cosy",
                              doc_string=doc)
    model.ir_version = _IR_VERSION
    return model


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.ascontiguousarray(array), name)


def write_speech_tokenizer_onnx(path: Path, seed: int) -> Path:
    """Write a random `speech_tokenizer_v2.onnx` stand-in (about 1 MB) to `path`; returns the path."""
    rng = np.random.default_rng(seed)
    conv_w = rng.normal(0, 1 / np.sqrt(TOKENIZER_MELS * TOKENIZER_STRIDE),
                        (_HIDDEN, TOKENIZER_MELS, TOKENIZER_STRIDE)).astype(np.float32)
    conv_b = rng.normal(0, 0.1, (_HIDDEN,)).astype(np.float32)
    proj = rng.normal(0, 1 / np.sqrt(_HIDDEN), (_HIDDEN, SPEECH_TOKEN_CLASSES)).astype(np.float32)
    nodes = [
        # valid-frame mask (B, 1, T) from feats_length, as the real encoder masks padding
        helper.make_node("Shape", ["feats"], ["shape"]),
        helper.make_node("Gather", ["shape", "two"], ["n_frames"], axis=0),
        helper.make_node("Range", ["zero", "n_frames", "one"], ["frame_idx"]),
        helper.make_node("Cast", ["feats_length"], ["len64"], to=TensorProto.INT64),
        helper.make_node("Unsqueeze", ["len64", "axis1"], ["len_col"]),
        helper.make_node("Less", ["frame_idx", "len_col"], ["valid"]),
        helper.make_node("Cast", ["valid"], ["valid_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["valid_f", "axis1"], ["mask"]),
        helper.make_node("Mul", ["feats", "mask"], ["masked"]),
        # (B, 128, T) -> (B, H, ceil(T/4))
        helper.make_node("Conv", ["masked", "conv_w", "conv_b"], ["hidden"], kernel_shape=[TOKENIZER_STRIDE],
                         strides=[TOKENIZER_STRIDE], pads=[0, TOKENIZER_STRIDE - 1]),
        helper.make_node("Tanh", ["hidden"], ["act"]),
        helper.make_node("Transpose", ["act"], ["act_t"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["act_t", "proj"], ["logits"]),  # (B, T', 6561)
        helper.make_node("ArgMax", ["logits"], ["argmax"], axis=2, keepdims=0),
        helper.make_node("Cast", ["argmax"], ["indices"], to=TensorProto.INT32),
    ]
    inits = [
        _init("conv_w", conv_w), _init("conv_b", conv_b), _init("proj", proj),
        _init("two", np.array(2, dtype=np.int64)), _init("zero", np.array(0, dtype=np.int64)),
        _init("one", np.array(1, dtype=np.int64)), _init("axis1", np.array([1], dtype=np.int64)),
    ]
    graph = helper.make_graph(
        nodes, "speech_tokenizer_v2_random",
        inputs=[helper.make_tensor_value_info("feats", TensorProto.FLOAT, ["batch", TOKENIZER_MELS, "frames"]),
                helper.make_tensor_value_info("feats_length", TensorProto.INT32, ["batch"])],
        outputs=[helper.make_tensor_value_info("indices", TensorProto.INT32, ["batch", "tokens"])],
        initializer=inits)
    return _save(_model(graph, f"random stand-in for speech_tokenizer_v2.onnx (seed {seed})"), path)


def write_campplus_onnx(path: Path, seed: int) -> Path:
    """Write a random `campplus.onnx` stand-in (about 50 KB) to `path`; returns the path."""
    rng = np.random.default_rng(seed)
    w1 = rng.normal(0, 1 / np.sqrt(FBANK_DIM), (FBANK_DIM, _HIDDEN * 4)).astype(np.float32)
    b1 = rng.normal(0, 0.5, (_HIDDEN * 4,)).astype(np.float32)
    w2 = rng.normal(0, 1 / np.sqrt(_HIDDEN * 4), (_HIDDEN * 4, EMBED_DIM)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["input", "w1"], ["h"]),  # (B, T, 4H)
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Tanh", ["hb"], ["act"]),
        helper.make_node("ReduceMean", ["act"], ["pooled"], axes=[1], keepdims=0),  # (B, 4H)
        helper.make_node("MatMul", ["pooled", "w2"], ["output"]),  # (B, 192)
    ]
    graph = helper.make_graph(
        nodes, "campplus_random",
        inputs=[helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", "frames", FBANK_DIM])],
        outputs=[helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", EMBED_DIM])],
        initializer=[_init("w1", w1), _init("b1", b1), _init("w2", w2)])
    return _save(_model(graph, f"random stand-in for campplus.onnx (seed {seed})"), path)
