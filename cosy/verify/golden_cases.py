"""How each kind of golden case is recomputed with our code (used by `cosy.verify.golden_check`).

A handler takes the golden directory and one case and returns our value for each of the case's outputs:
a tensor (compared with the stored tensor, or its windows and checksums), or a plain value (compared
exactly). Handlers are chosen by the case's `producer` text, so any directory of the format works.

Which handlers apply is the model family's (of the golden `model/` directory): `ModelFamily.golden_handlers`
names lists of (test on the producer, handler) as "module:attribute"; `HANDLERS` below are CosyVoice2's.
A family's lists are searched in order, the first match wins; a named module that does not exist is
skipped (its cases then report "not understood").
"""
from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from cosy.audio.features import flow_mel, kaldi_fbank, whisper_log_mel
from cosy.audio.io import load_prompt_wav
from cosy.lm.model import SpeechLM
from cosy.model.family import ModelFamily, import_object
from cosy.model.files import ModelDir
from cosy.model.load import load_flow, load_hift
from cosy.text.frontend import TextFrontend
from cosy.text.tokenizer import TextTokenizer


class GoldenModels:
    """Our modules for one golden directory, built on first use."""

    def __init__(self, root: Path, tensors: dict[str, Tensor], extra: dict, model_dir: Path | None = None):
        """model_dir: the golden model (default root/model; golden-bistream names ../golden/model)."""
        self.root, self.tensors, self.extra = root, tensors, extra
        self.model_dir = model_dir or root / "model"

    @cached_property
    def model(self) -> ModelDir:
        return ModelDir(self.model_dir)

    @cached_property
    def family(self) -> ModelFamily:
        return self.model.family

    @cached_property
    def flow(self):
        return load_flow(self.model)

    @cached_property
    def hift(self):
        return load_hift(self.model)

    @cached_property
    def lm(self) -> SpeechLM:
        return SpeechLM.from_model_dir(self.model.path)

    @cached_property
    def text(self) -> TextFrontend:
        """The golden `tokenizer/` (CosyVoice2's format) or else the model's own CosyVoice-BlankEN (CosyVoice3),
        with the family's special tokens."""
        tokenizer_dir = self.root / "tokenizer"
        if not tokenizer_dir.is_dir():
            tokenizer_dir = self.model.file(self.family.files.qwen_dir)
        return TextFrontend(TextTokenizer.from_dir(tokenizer_dir, import_object(self.family.text_specials)))

    def find_file(self, name: str) -> Path:
        """An input file named relative to the repository the fixtures came from (`shared/assets/x.wav`):
        look beside the golden dir and up its parents, also under `assets/` by base name."""
        rel = Path(name)
        for base in [self.root, *self.root.resolve().parents, Path.cwd()]:
            for candidate in (base / rel, base / "assets" / rel.name):
                if candidate.is_file():
                    return candidate
        raise FileNotFoundError(f"input file '{name}' not found near {self.root}")

    def tensor(self, spec: object) -> Tensor:
        """An input given as {"tensor": name}, as "name", or as "name[:, :N]"-style slice text."""
        if isinstance(spec, dict):
            return self.tensors[spec["tensor"]]
        m = re.fullmatch(r"\s*([\w.]+)\s*(\[.*\])?\s*", str(spec))
        if not m or m.group(1) not in self.tensors:
            raise KeyError(f"input '{spec}' names no tensor")
        t = self.tensors[m.group(1)]
        if m.group(2):
            index = []
            for part in m.group(2)[1:-1].split(","):
                bounds = [int(b) if b.strip() else None for b in part.split(":")]
                index.append(slice(*bounds) if len(bounds) > 1 else bounds[0])
            t = t[tuple(index)]
        return t


Handler = Callable[[GoldenModels, dict], dict[str, Any]]


def flow_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    inp, args = case["inputs"], case["args"]
    mel = g.flow.inference(g.tensor(inp["token"]), g.tensor(inp["prompt_token"]), g.tensor(inp["prompt_feat"]),
                           g.tensor(inp["embedding"]), streaming=bool(args["streaming"]),
                           finalize=bool(args["finalize"]))
    return {"mel": mel}


@torch.inference_mode()
def hift_f0_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    return {"f0": g.hift.predict_f0(g.tensor(case["inputs"]["speech_feat"]))}


@torch.inference_mode()
def hift_zero_noise_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    speech, source = g.hift.inference(g.tensor(case["inputs"]["speech_feat"]), noise=False)
    return {"source": source, "speech": speech}


@torch.inference_mode()
def hift_decode_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    inp = case["inputs"]
    return {"speech": g.hift.decode(g.tensor(inp["x"]), g.tensor(inp["s"]))}


def _wav(g: GoldenModels, case: dict, sr: int) -> Tensor:
    return load_prompt_wav(g.find_file(case["inputs"]["wav_file"]), sr)


def load_wav_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    return {"speech": _wav(g, case, int(case["args"]["target_sr"]))}


def whisper_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    feats = whisper_log_mel(_wav(g, case, 16000))
    return {"feats": feats, "feats_length": feats.shape[2]}


def fbank_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    return {"feats": kaldi_fbank(_wav(g, case, 16000)).unsqueeze(0)}


def flow_mel_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    mel = flow_mel(_wav(g, case, 24000))
    return {"speech_feat": mel, "speech_feat_len": mel.shape[1]}


def alignment_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    """Official rule: token_len = min(mel_frames // 2, n_tokens); the mel is cut to 2 * token_len."""
    mel = flow_mel(_wav(g, case, 24000))
    whisper_frames = whisper_log_mel(_wav(g, case, 16000)).shape[2]
    n_tokens = int(case["args"]["placeholder_speech_token_len"])
    token_len = min(mel.shape[1] // 2, n_tokens)
    return {"raw_mel_len": mel.shape[1], "whisper_frames": whisper_frames, "aligned_token_len": token_len,
            "aligned_mel_len": 2 * token_len, "aligned_mel_shape": [1, 2 * token_len, mel.shape[2]]}


def tokenizer_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    tok = g.text.tokenizer
    items = g.extra["tokenizer"]
    out: dict[str, Any] = {f"encode[{i}]": (tok.encode(e["text"]), e["ids"]) for i, e in enumerate(items["encode"])}
    out["len"] = (len(tok), items["len"])
    out["special_token_ids"] = ({t: tok.token_id(t) for t in items["special_token_ids"]}, items["special_token_ids"])
    return out


def text_normalize_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for i, e in enumerate(g.extra["text_normalize"]):
        segments = g.text.normalize(e["input"], split=True)
        out[f"[{i}].segments"] = (segments, e["segments"])
        out[f"[{i}].segment_token_ids"] = ([g.text.encode(s) for s in segments], e["segment_token_ids"])
        out[f"[{i}].split_false"] = (g.text.normalize(e["input"], split=False)[0], e["split_false"])
    return out


def lm_case(g: GoldenModels, case: dict) -> dict[str, Any]:
    inp = case["inputs"]

    def ids(name: str) -> list[int]:
        spec = inp.get(name)
        return g.tensor(spec).flatten().tolist() if isinstance(spec, dict) else []

    embeds = g.lm.prompt_embeds(ids("text"), ids("prompt_text"), ids("prompt_speech_token"))
    continuation = g.tensor(inp["continuation"]).flatten().tolist()
    logp, hidden = g.lm.teacher_forced_logprobs(embeds, continuation)
    return {"lm_input": embeds, "logp": logp, "last_hidden": hidden}


# (test on the case's `producer`, handler); the first match wins.
HANDLERS: list[tuple[Callable[[str], bool], Handler]] = [
    (lambda p: "CausalMaskedDiffWithXvec.inference" in p, flow_case),
    (lambda p: "f0_predictor" in p and "inference" not in p, hift_f0_case),
    (lambda p: "HiFTGenerator.inference" in p and "zeros" in p, hift_zero_noise_case),
    (lambda p: "HiFTGenerator.decode" in p, hift_decode_case),
    (lambda p: p.endswith("load_wav"), load_wav_case),
    (lambda p: "_extract_speech_token" in p, whisper_case),
    (lambda p: "_extract_spk_embedding" in p, fbank_case),
    (lambda p: "_extract_speech_feat" in p, flow_mel_case),
    (lambda p: "frontend_zero_shot" in p or "frontend_cross_lingual" in p, alignment_case),
    (lambda p: "Tokenizer.encode" in p, tokenizer_case),
    (lambda p: "text_normalize" in p, text_normalize_case),
    (lambda p: "Qwen2LM.inference" in p, lm_case),
]


def family_handlers(family: ModelFamily) -> list[tuple[Callable[[str], bool], Handler]]:
    """The family's handler lists (`ModelFamily.golden_handlers`, in order) concatenated."""
    return [h for spec in family.golden_handlers for h in import_object(spec)]


def handler_for(case: dict, family: ModelFamily | None = None, default_producer: str = "") -> Handler | None:
    """The first handler of `family` (default: CosyVoice2's `HANDLERS`) whose test accepts the producer (a
    case without one: `default_producer`, the directory's format line)."""
    producer = case.get("producer") or default_producer
    handlers = HANDLERS if family is None else family_handlers(family)
    return next((h for test, h in handlers if test(producer)), None)
