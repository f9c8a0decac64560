"""The forced aligner (`--aligner MODEL_DIR`): a wav2vec2 CTC model directory in the Hugging Face format, and
word timings for one finished sentence from its audio and its text.

    aligner = Aligner.load("mms-300m-1130-forced-aligner", device="cpu")   # AlignerLoadError: the reason
    fill_words(aligner, sentence, audio, 24000)                             # sentence.words = [WordTiming...]

The directory: `config.json` (`cosy.align.config`), `vocab.json` (token -> id, with `<blank>` or the pad
token as the CTC blank), `model.safetensors` or `pytorch_model.bin`, and optionally `preprocessor_config.json`
(`do_normalize`, `sampling_rate`). How a sentence is aligned follows the `ctc-forced-aligner` package (the
published usage of the MMS aligner): the audio at the model's rate (normalized to zero mean and unit variance
where the preprocessor says so), log-softmax emissions plus a `<star>` column of log-probability 0, the targets
a `<star>` before each word's letters (the star soaks up speech the text does not spell: digits the
normalizer read out, a breath), the Viterbi path (`cosy.align.ctc`).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from cosy.align.config import AlignerConfig, read_aligner_config
from cosy.align.ctc import AlignmentError, forced_align, token_spans
from cosy.align.wav2vec2 import Wav2Vec2ForCTC, canonical_keys
from cosy.align.words import Word, split_words
from cosy.pipeline.timing import SentenceTiming, WordTiming

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
STAR = "<star>"


class AlignerLoadError(ValueError):
    """The aligner directory does not load; the message names the file and the problem."""


@dataclass(frozen=True)
class WordSpan:
    """One word: `text[begin:end]` of the sentence, spoken from `start_ms` to `end_ms` of the sentence's audio."""

    begin: int
    end: int
    start_ms: float
    end_ms: float


def _read_json(path: Path) -> dict:
    try:
        out = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise AlignerLoadError(f"{path.name} is not a readable JSON file ({type(e).__name__}: {e})") from None
    if not isinstance(out, dict):
        raise AlignerLoadError(f"{path.name} is not a JSON object")
    return out


def read_vocab(path: Path, cfg: AlignerConfig) -> dict[str, int]:
    """vocab.json, lower-cased as the package reads it: ids 0..vocab_size-1 each once, a blank among them."""
    vocab = {str(k).lower(): v for k, v in _read_json(path).items()}
    ids = sorted(vocab.values()) if all(isinstance(v, int) for v in vocab.values()) else None
    if ids != list(range(cfg.vocab_size)):
        raise AlignerLoadError(f"{path.name} must map {cfg.vocab_size} tokens (config.json's vocab_size) to the "
                               f"ids 0..{cfg.vocab_size - 1}, each once; it has {len(vocab)} tokens")
    if "<blank>" not in vocab and "<pad>" not in vocab:
        raise AlignerLoadError(f"{path.name} has no CTC blank (<blank> or <pad>)")
    if not any("a" <= k <= "z" for k in vocab if len(k) == 1):
        raise AlignerLoadError(f"{path.name} has no latin letters: the text is romanized to a-z for this aligner")
    return vocab


def _weights(model_dir: Path) -> Path:
    for name in WEIGHT_FILES:
        if (model_dir / name).exists():
            return model_dir / name
    raise AlignerLoadError(f"no weights: neither {' nor '.join(WEIGHT_FILES)} is in the directory")


def _read_state(path: Path, shapes_only: bool = False) -> dict:
    """The checkpoint's tensors (or, `shapes_only`, their shapes from the file's header: no weights read)."""
    try:
        if path.name.endswith(".safetensors"):
            from safetensors import safe_open
            if shapes_only:
                with safe_open(path, "pt") as f:
                    return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
            from safetensors.torch import load_file
            return load_file(path)
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return {k: tuple(v.shape) for k, v in state.items()} if shapes_only else state
    except Exception as e:  # a truncated or foreign file: any reader error is "does not load"
        raise AlignerLoadError(f"{path.name} does not load ({type(e).__name__}: {e})") from None


def check_state(name: str, shapes: dict[str, tuple[int, ...]], cfg: AlignerConfig) -> None:
    """Every tensor the model of `cfg` has, with its shape, and no other: AlignerLoadError naming the first few."""
    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in Wav2Vec2ForCTC(cfg).state_dict().items()}
    have = {k: tuple(v) for k, v in canonical_keys(shapes).items()}
    missing = sorted(set(want) - set(have))
    unexpected = sorted(set(have) - set(want))
    wrong = sorted(k for k in set(want) & set(have) if want[k] != have[k])
    if missing or unexpected or wrong:
        parts = [f"{label}: {', '.join(keys[:3])}{' ...' if len(keys) > 3 else ''}"
                 for label, keys in (("missing", missing), ("unexpected", unexpected)) if keys]
        parts += [f"{k} has shape {list(have[k])}, config.json says {list(want[k])}" for k in wrong[:3]]
        raise AlignerLoadError(f"{name} does not match config.json ({'; '.join(parts)})")


@dataclass(frozen=True)
class AlignerDir:
    """A checked aligner directory: its config, vocab, whether the audio is normalized, the weights file."""

    cfg: AlignerConfig
    vocab: dict[str, int]
    normalize: bool
    weights: Path


def check_model_dir(model_dir: str | Path) -> AlignerDir:
    """Everything but the weights' values (the header's names and shapes): cheap enough for a start-up check.
    AlignerLoadError with the reason."""
    d = Path(model_dir)
    if not d.is_dir():
        raise AlignerLoadError(f"{model_dir} is not a directory")
    if not (d / "config.json").exists():
        raise AlignerLoadError("no config.json in the directory (a Hugging Face wav2vec2 CTC model)")
    try:
        cfg = read_aligner_config(d / "config.json")
    except ValueError as e:
        raise AlignerLoadError(str(e)) from None
    pre = _read_json(d / "preprocessor_config.json") if (d / "preprocessor_config.json").exists() else {}
    rate = pre.get("sampling_rate", cfg.sampling_rate)
    if rate != cfg.sampling_rate:
        raise AlignerLoadError(f"preprocessor_config.json: sampling_rate {rate} is not supported "
                               f"(wav2vec2 models take {cfg.sampling_rate} Hz)")
    if not (d / "vocab.json").exists():
        raise AlignerLoadError("no vocab.json in the directory (the CTC tokens)")
    vocab = read_vocab(d / "vocab.json", cfg)
    weights = _weights(d)
    check_state(weights.name, _read_state(weights, shapes_only=True), cfg)
    return AlignerDir(cfg, vocab, bool(pre.get("do_normalize", True)), weights)


class Aligner:
    """A loaded CTC aligner on one device."""

    def __init__(self, model: Wav2Vec2ForCTC, vocab: dict[str, int], normalize: bool, device: str):
        self.model = model
        self.cfg = model.cfg
        self.vocab = {**vocab, STAR: len(vocab)}  # the star: one extra emission column of log-probability 0
        self.blank = vocab.get("<blank>", vocab.get("<pad>"))
        self.alphabet = frozenset(k for k in vocab if len(k) == 1 and (k.isalpha() or k == "'"))
        self.normalize = normalize
        self.device = torch.device(device)

    @classmethod
    def load(cls, model_dir: str | Path, device: str = "cpu") -> "Aligner":
        """Load the directory onto `device`. AlignerLoadError with the reason where it does not load."""
        d = check_model_dir(model_dir)
        model = Wav2Vec2ForCTC(d.cfg)
        try:
            model.load_state_dict(canonical_keys(_read_state(d.weights)), strict=True)
        except RuntimeError as e:  # names and shapes were checked: what is left is a damaged tensor
            raise AlignerLoadError(f"{d.weights.name} does not load ({e})") from None
        model.fold_weight_norm()
        model.to(device).eval()
        return cls(model, d.vocab, d.normalize, device)

    @torch.inference_mode()
    def emissions(self, audio: np.ndarray | torch.Tensor, sample_rate: int) -> np.ndarray:
        """(T, vocab + 1) float32 log-probabilities (the last column: the star, 0) of mono `audio`."""
        from cosy.audio.resample import resample
        wav = torch.as_tensor(np.asarray(audio, dtype=np.float32)).reshape(-1)
        if self.cfg.num_frames(math.ceil(wav.numel() * self.cfg.sampling_rate / sample_rate)) < 1:
            return np.zeros((0, len(self.vocab)), dtype=np.float32)  # shorter than one frame's receptive field
        wav = resample(wav, sample_rate, self.cfg.sampling_rate)
        if self.normalize:  # the feature extractor's do_normalize: zero mean, unit variance
            wav = (wav - wav.mean()) / torch.sqrt(wav.var(unbiased=False) + 1e-7)
        logits = self.model(wav[None].to(self.device))[0].float()
        lp = torch.log_softmax(logits, dim=-1).cpu().numpy()
        return np.concatenate([lp, np.zeros((lp.shape[0], 1), dtype=np.float32)], axis=1)

    def frame_ms(self) -> float:
        return self.cfg.frame_samples * 1000 / self.cfg.sampling_rate

    def align(self, audio: np.ndarray | torch.Tensor, sample_rate: int, text: str) -> list[WordSpan]:
        """The words of `text` (`cosy.align.words`) and when each is spoken in `audio`."""
        words = split_words(text, self.alphabet)
        duration = len(np.asarray(audio).reshape(-1)) * 1000 / sample_rate
        if not words:
            return []
        return align_words(words, self.emissions(audio, sample_rate), self.vocab, self.blank, self.frame_ms(),
                           duration)


def align_words(words: list[Word], emissions: np.ndarray, vocab: dict[str, int], blank: int, frame_ms: float,
                duration_ms: float) -> list[WordSpan]:
    """Each word's time from the CTC path of its letters (a star before each word with letters); words
    without letters, and all words where the audio is too short for the letters, share the time their
    neighbours leave, in proportion to their length."""
    star = vocab[STAR]
    targets, owner = [], []  # owner: the word index of each target (-1: a star)
    for i, w in enumerate(words):
        if w.letters:
            targets.append(star)
            owner.append(-1)
            for c in w.letters:
                targets.append(vocab[c])
                owner.append(i)
    times: list[tuple[float, float] | None] = [None] * len(words)
    if targets:
        try:
            path = forced_align(emissions, np.asarray(targets, dtype=np.int64), blank=blank)
        except AlignmentError:
            path = None
        if path is not None:
            for span in token_spans(path, len(targets)):
                i = owner[span.index]
                if i < 0:
                    continue
                start, end = span.start * frame_ms, min((span.end + 1) * frame_ms, duration_ms)
                times[i] = (start, end) if times[i] is None else (times[i][0], end)
    _share_gaps(words, times, duration_ms)
    return [WordSpan(w.begin, w.end, *t) for w, t in zip(words, times)]


def _share_gaps(words: list[Word], times: list[tuple[float, float] | None], duration_ms: float) -> None:
    """Fill each run of untimed words with the gap between the timed words around it, split by length."""
    i = 0
    while i < len(words):
        if times[i] is not None:
            i += 1
            continue
        j = i
        while j < len(words) and times[j] is None:
            j += 1
        lo = times[i - 1][1] if i > 0 else 0.0
        hi = times[j][0] if j < len(words) else duration_ms
        hi = max(hi, lo)
        total = sum(len(w.text) for w in words[i:j])
        at = lo
        for k in range(i, j):
            step = (hi - lo) * len(words[k].text) / total
            times[k] = (at, at + step)
            at += step
        i = j


def fill_words(aligner: Aligner, sentence: SentenceTiming, audio: np.ndarray | torch.Tensor) -> list[WordTiming]:
    """Set `sentence.words` from its audio (the output samples begin_sample..end_sample, at
    `sentence.sample_rate`) and its text; returns them. Offsets are into the caller's text (the sentence's
    `begin_index` added), times in ms of the output audio (the sentence's `begin_time` added)."""
    base_ms = sentence.begin_sample * 1000 / sentence.sample_rate
    end_ms = sentence.end_time if sentence.end_sample is not None else math.inf
    words = []
    for w in aligner.align(audio, sentence.sample_rate, sentence.text):
        begin = min(round(base_ms + w.start_ms), end_ms)
        words.append(WordTiming(text=sentence.text[w.begin:w.end], begin_index=sentence.begin_index + w.begin,
                                end_index=sentence.begin_index + w.end, begin_time=begin,
                                end_time=max(begin, min(round(base_ms + w.end_ms), end_ms))))
    sentence.words = words
    return words


__all__ = ["Aligner", "AlignerDir", "AlignerLoadError", "WordSpan", "align_words", "check_model_dir", "check_state",
           "fill_words", "read_vocab"]
