"""The forced aligner (cosy.align): the CTC Viterbi exact on emissions whose best path is known by construction
and equal, frame for frame, to the `ctc-forced-aligner` package's kernel (torchaudio's forced_align CPU code)
on the same emissions; the loader on a random-weight directory our builder writes in the published format,
and refusing damaged ones with the reason; words and their offsets into the caller's text."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from cosy.align.aligner import Aligner, AlignerLoadError, fill_words
from cosy.align.ctc import AlignmentError, forced_align, label_path, min_frames, token_spans
from cosy.align.words import split_words
from cosy.pipeline.timing import SentenceTiming
from cosy.verify.random_model import write_random_model

pytestmark = pytest.mark.quick


def _random_path(rng: np.random.Generator, targets: np.ndarray, num_frames: int) -> np.ndarray:
    """A valid CTC state path through `targets` over `num_frames` frames, drawn at random: the states each
    target and each blank gap occupy, with the frames beyond the minimum spread at random."""
    states = [0]  # the optional leading blank: 0 frames or more
    for j in range(len(targets)):
        states.append(2 * j + 1)
        states.append(2 * j + 2)
    # a blank gap between equal targets needs at least one frame, the others may be empty
    need = np.zeros(len(states), dtype=int)
    need[1::2] = 1
    for j in range(1, len(targets)):
        if targets[j] == targets[j - 1]:
            need[2 * j] = 1
    extra = num_frames - need.sum()
    counts = need + rng.multinomial(extra, np.ones(len(states)) / len(states))
    return np.repeat(np.array(states), counts)


def _emissions_for(rng: np.random.Generator, path: np.ndarray, targets: np.ndarray, num_classes: int) -> np.ndarray:
    """Log-probabilities where the path's label is far likelier than any other on every frame, so it is the
    only best path (another path differs in at least one frame's label)."""
    labels = label_path(path, targets)
    logits = rng.normal(0, 1, (len(path), num_classes)).astype(np.float32)
    logits[np.arange(len(path)), labels] += 20.0
    return torch.log_softmax(torch.from_numpy(logits), -1).numpy()


@pytest.mark.parametrize("seed", range(20))
def test_viterbi_finds_the_path_known_by_construction(seed):
    rng = np.random.default_rng(seed)
    num_classes = 6
    # few classes: repeats happen; some long enough for hundreds of states
    targets = rng.integers(1, num_classes, rng.integers(1, 12) if seed % 4 else rng.integers(100, 300))
    num_frames = min_frames(targets) + int(rng.integers(0, 15))
    path = _random_path(rng, targets, num_frames)
    got = forced_align(_emissions_for(rng, path, targets, num_classes), targets, blank=0)
    assert np.array_equal(got, path)
    for span in token_spans(got, len(targets)):
        frames = np.flatnonzero(path == 2 * span.index + 1)
        assert (span.start, span.end) == (frames[0], frames[-1])


def test_viterbi_tight_and_degenerate_cases():
    targets = np.array([3, 3, 3])  # 3 targets, 2 repeats: exactly 5 frames, blanks forced between
    lp = np.log(np.full((5, 4), 0.25, dtype=np.float32))
    assert forced_align(lp, targets).tolist() == [1, 2, 3, 4, 5]
    with pytest.raises(AlignmentError, match="at least 5 frames"):
        forced_align(lp[:4], targets)
    with pytest.raises(AlignmentError, match="never the blank"):
        forced_align(lp, np.array([1, 0]))
    assert forced_align(lp, np.array([], dtype=np.int64)).tolist() == [0] * 5


def _reference(lp: np.ndarray, targets: np.ndarray, blank: int) -> np.ndarray:
    from ctc_forced_aligner import forced_align as reference  # torchaudio's CPU kernel, as that package ships it
    paths, _ = reference(lp[None].astype(np.float32), targets[None].astype(np.int64), blank=blank)
    return np.asarray(paths).reshape(-1)


def _reference_stays_in_its_buffer(num_frames: int, targets: np.ndarray) -> bool:
    """Whether the reference kernel writes only inside its back-pointer bits ((S + 1) * (T - L) of them; it
    writes one per state of its window per frame, more than that when few frames are spare, and then may
    return a path that skips a target or crash; with one frame it reads an empty array)."""
    num_targets, num_states = len(targets), 2 * len(targets) + 1
    repeats = int(np.count_nonzero(targets[1:] == targets[:-1]))
    start, end, seek, written = (0 if num_frames > num_targets + repeats else 1), (1 if num_states == 1 else 2), 0, 0
    for t in range(1, num_frames):
        if num_frames - t <= num_targets + repeats:
            if start % 2 == 1 and targets[start // 2] != targets[start // 2 + 1]:
                start += 1
            start += 1
        if t <= num_targets + repeats:
            if end % 2 == 0 and end < 2 * num_targets and targets[end // 2 - 1] != targets[end // 2]:
                end += 1
            end += 1
        first = start + 1 if start == 0 else start
        seek += start == 0
        written = max(written, seek + end - first)
        seek += end - first
    return num_frames >= 2 and written <= (num_states + 1) * (num_frames - num_targets)


@pytest.mark.parametrize("seed", range(60))
def test_viterbi_equals_the_reference_kernel(seed):
    rng = np.random.default_rng(1000 + seed)
    num_classes = int(rng.integers(3, 33))
    blank = int(rng.integers(0, num_classes)) if seed % 3 else 0
    others = np.array([c for c in range(num_classes) if c != blank])
    targets = rng.choice(others, int(rng.integers(1, 40)))
    slack = [3, 8, 50, 400][seed % 4]
    num_frames = min_frames(targets) + slack
    if not _reference_stays_in_its_buffer(num_frames, targets):
        num_frames += 4 * len(targets)
    assert _reference_stays_in_its_buffer(num_frames, targets)
    logits = rng.normal(0, [0.5, 3.0][seed % 2], (num_frames, num_classes)).astype(np.float32)
    lp = torch.log_softmax(torch.from_numpy(logits), -1).numpy()
    if seed % 5 == 0:  # a star-like column of log-probability 0, as the aligner appends
        lp[:, others[0]] = 0.0
    ours = label_path(forced_align(lp, targets, blank=blank), targets, blank)
    assert np.array_equal(ours, _reference(lp, targets, blank))


def _all_paths(num_frames: int, targets: np.ndarray):
    """Every valid CTC state path (small cases only)."""
    num_states = 2 * len(targets) + 1

    def moves(s):
        yield s
        if s + 1 < num_states:
            yield s + 1
        if s + 2 < num_states and (s + 2) % 2 == 1 and s >= 1 and targets[(s + 2) // 2] != targets[s // 2]:
            yield s + 2

    def walk(prefix):
        if len(prefix) == num_frames:
            if prefix[-1] >= num_states - 2:
                yield prefix
            return
        for s in moves(prefix[-1]):
            yield from walk(prefix + [s])

    for first in (0, 1) if num_states > 1 else (0,):
        yield from walk([first])


def test_viterbi_returns_a_most_likely_path_even_on_ties():
    # integer log-probabilities make exact ties common; the best score over every path is the truth
    rng = np.random.default_rng(7)
    checked = 0
    for _ in range(300):
        targets = rng.integers(1, 3, int(rng.integers(1, 4)))
        num_frames = min_frames(targets) + int(rng.integers(0, 4))
        lp = -rng.integers(0, 3, (num_frames, 3)).astype(np.float32)
        best = max(sum(lp[t, lab] for t, lab in enumerate(label_path(np.array(p), targets)))
                   for p in _all_paths(num_frames, targets))
        path = forced_align(lp, targets)
        assert list(path) in [list(p) for p in _all_paths(num_frames, targets)]
        assert lp[np.arange(num_frames), label_path(path, targets)].sum() == best
        checked += 1
    assert checked == 300


@pytest.fixture(scope="module")
def tiny_aligner_dir(tmp_path_factory) -> Path:
    return write_random_model(tmp_path_factory.mktemp("aligner"), "tiny", seed=0, family="mms-aligner")


def test_builder_writes_the_published_layout_and_it_loads(tiny_aligner_dir):
    d = tiny_aligner_dir
    assert sorted(p.name for p in d.iterdir()) == ["config.json", "model.safetensors", "preprocessor_config.json",
                                                    "vocab.json"]
    config = json.loads((d / "config.json").read_text())
    assert config["architectures"] == ["Wav2Vec2ForCTC"] and config["do_stable_layer_norm"]
    vocab = json.loads((d / "vocab.json").read_text())
    assert vocab["<blank>"] == 0 and vocab["a"] == 4 and vocab["x"] == 30 and len(vocab) == config["vocab_size"]
    from safetensors import safe_open
    with safe_open(d / "model.safetensors", "pt") as f:
        keys = set(f.keys())
    assert {"lm_head.weight", "wav2vec2.encoder.pos_conv_embed.conv.weight_g",
            "wav2vec2.feature_extractor.conv_layers.0.layer_norm.weight",
            "wav2vec2.encoder.layers.1.attention.q_proj.weight", "wav2vec2.encoder.layer_norm.bias"} <= keys
    aligner = Aligner.load(d)
    audio = np.random.default_rng(0).normal(0, 0.1, 24000).astype(np.float32)  # 1 s at 24 kHz
    em = aligner.emissions(audio, 24000)
    assert em.shape == (aligner.cfg.num_frames(16000), 32) == (49, 32)  # 31 tokens and the star
    assert np.allclose(np.exp(em[:, :-1]).sum(-1), 1, atol=1e-5) and (em[:, -1] == 0).all()
    # same directory, same weights: the same emissions
    assert np.array_equal(em, Aligner.load(d).emissions(audio, 24000))


def test_loader_accepts_the_parametrized_weight_norm_names(tiny_aligner_dir, tmp_path):
    from safetensors.torch import load_file, save_file
    d = tmp_path / "parametrized"
    d.mkdir()
    for name in ("config.json", "vocab.json", "preprocessor_config.json"):
        (d / name).write_bytes((tiny_aligner_dir / name).read_bytes())
    state = load_file(tiny_aligner_dir / "model.safetensors")
    prefix = "wav2vec2.encoder.pos_conv_embed.conv."
    state[prefix + "parametrizations.weight.original0"] = state.pop(prefix + "weight_g")
    state[prefix + "parametrizations.weight.original1"] = state.pop(prefix + "weight_v")
    save_file(state, d / "model.safetensors")
    audio = np.random.default_rng(1).normal(0, 0.1, 16000).astype(np.float32)
    want = Aligner.load(tiny_aligner_dir).emissions(audio, 16000)
    assert np.array_equal(Aligner.load(d).emissions(audio, 16000), want)


# transformers' Wav2Vec2ForCTC, run apart: its import pulls in torchvision, whose build here does not match torch
# (hidden, transformers treats it as absent); prints the largest difference from ours and what it loaded
_TRANSFORMERS = """
import json
import sys
sys.modules["torchvision"] = sys.modules["torchaudio"] = None
import torch
from transformers.models.wav2vec2.modeling_wav2vec2 import Wav2Vec2ForCTC
from cosy.align.aligner import Aligner
torch.manual_seed(0)
wav = torch.randn(1, 20000)
theirs, info = Wav2Vec2ForCTC.from_pretrained(sys.argv[1], output_loading_info=True)
with torch.no_grad():
    ref = theirs.eval()(wav).logits
    ours = Aligner.load(sys.argv[1]).model(wav)
print(json.dumps({"same_shape": ref.shape == ours.shape, "diff": (ref - ours).abs().max().item(),
                  "scale": ref.abs().max().item(), "missing": sorted(info["missing_keys"]),
                  "unexpected": sorted(info["unexpected_keys"])}))
"""


@pytest.mark.parametrize("variant", ["published", "post_norm"])
def test_the_model_equals_transformers_wav2vec2_on_our_builders_directory(tiny_aligner_dir, tmp_path, variant):
    """The builder's directory loads in transformers with every key used, and our model's logits are its
    logits. post_norm: the other wav2vec2 layout (GroupNorm after the first conv, post-norm layers)."""
    import subprocess
    import sys
    d = tiny_aligner_dir
    if variant == "post_norm":
        from safetensors.torch import save_file

        from cosy.align.config import read_aligner_config
        from cosy.align.wav2vec2 import Wav2Vec2ForCTC
        d = _copy(tiny_aligner_dir, tmp_path / variant)
        config = {**json.loads((d / "config.json").read_text()), "feat_extract_norm": "group",
                  "do_stable_layer_norm": False, "conv_bias": False}
        (d / "config.json").write_text(json.dumps(config))
        torch.manual_seed(1)
        model = Wav2Vec2ForCTC(read_aligner_config(d / "config.json"))
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, d / "model.safetensors")
    out = subprocess.run([sys.executable, "-c", _TRANSFORMERS, str(d)], capture_output=True, text=True,
                         timeout=300, cwd=Path(__file__).parent.parent)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["same_shape"] and got["scale"] > 0.1
    assert got["diff"] <= 1e-5 * got["scale"], got
    # every key the builder writes is one transformers reads, and it reads no other (post_norm: written by our
    # model's state dict, which has no SpecAugment mask vector)
    assert got["unexpected"] == []
    assert got["missing"] == ([] if variant == "published" else ["wav2vec2.masked_spec_embed"])


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    return dst


@pytest.mark.parametrize("damage, reason", [
    ("no_config", "no config.json"),
    ("bad_json", "config.json is not a readable JSON file"),
    ("not_ctc", "expected Wav2Vec2ForCTC"),
    ("vocab_size", "vocab.json must map 31 tokens"),
    ("no_weights", "no weights"),
    ("truncated", "model.safetensors does not load"),
    ("missing_tensor", "missing: lm_head.bias"),
    ("wrong_shape", "has shape"),
])
def test_loader_refuses_a_damaged_directory_with_the_reason(tiny_aligner_dir, tmp_path, damage, reason):
    d = _copy(tiny_aligner_dir, tmp_path / damage)
    config = json.loads((d / "config.json").read_text())
    if damage == "no_config":
        (d / "config.json").unlink()
    elif damage == "bad_json":
        (d / "config.json").write_text("{")
    elif damage == "not_ctc":
        (d / "config.json").write_text(json.dumps({**config, "architectures": ["Wav2Vec2ForPreTraining"]}))
    elif damage == "vocab_size":
        vocab = json.loads((d / "vocab.json").read_text())
        del vocab["x"]
        (d / "vocab.json").write_text(json.dumps(vocab))
    elif damage == "no_weights":
        (d / "model.safetensors").unlink()
    elif damage == "truncated":
        data = (d / "model.safetensors").read_bytes()
        (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    elif damage == "missing_tensor":
        from safetensors.torch import load_file, save_file
        state = load_file(d / "model.safetensors")
        del state["lm_head.bias"]
        save_file(state, d / "model.safetensors")
    elif damage == "wrong_shape":
        (d / "config.json").write_text(json.dumps({**config, "intermediate_size": 48}))
    with pytest.raises(AlignerLoadError, match=reason):
        Aligner.load(d)


def test_words_chinese_per_character_others_on_blanks():
    alphabet = frozenset("abcdefghijklmnopqrstuvwxyz'")
    text = "Hello, world! 你好，世界。 It's 2024年 “OK”"
    words = split_words(text, alphabet)
    assert [w.text for w in words] == ["Hello", "world", "你", "好", "世", "界", "It's", "2024", "年", "OK"]
    assert all(text[w.begin:w.end] == w.text for w in words)
    assert [w.letters for w in words] == ["hello", "world", "ni", "hao", "shi", "jie", "it's", "", "nian", "ok"]


def test_fill_words_offsets_into_the_callers_text_and_times_within_the_sentence(tiny_aligner_dir):
    aligner = Aligner.load(tiny_aligner_dir)
    caller = "第一句。Hello, world! 你好 2024年 OK."
    begin = caller.index("Hello")
    text = caller[begin:]
    audio = np.random.default_rng(2).normal(0, 0.1, 24000 * 3).astype(np.float32)
    sentence = SentenceTiming(index=1, text=text, begin_index=begin, end_index=len(caller), begin_sample=36000,
                              end_sample=36000 + len(audio), sample_rate=24000)
    words = fill_words(aligner, sentence, audio)
    assert sentence.words == words
    assert [w.text for w in words] == ["Hello", "world", "你", "好", "2024", "年", "OK"]
    assert all(caller[w.begin_index:w.end_index] == w.text for w in words)
    times = [(w.begin_time, w.end_time) for w in words]
    assert times[0][0] >= sentence.begin_time and times[-1][1] <= sentence.end_time
    assert all(b <= e for b, e in times) and all(e0 <= b1 for (_, e0), (b1, _) in zip(times, times[1:]))
    # "2024" has no letters the model knows: it fills the gap between its neighbours
    assert words[4].begin_time == words[3].end_time and words[4].end_time == words[5].begin_time


@pytest.mark.parametrize("samples", [0, 100, 2000])  # no audio, less than one frame's receptive field, 4 frames
def test_fill_words_on_audio_too_short_for_the_letters(tiny_aligner_dir, samples):
    aligner = Aligner.load(tiny_aligner_dir)
    text = "Hi there 你好"
    sentence = SentenceTiming(index=0, text=text, begin_index=0, end_index=len(text), begin_sample=2400,
                              end_sample=2400 + samples, sample_rate=24000)
    words = fill_words(aligner, sentence, np.zeros(samples, np.float32))
    assert [w.text for w in words] == ["Hi", "there", "你", "好"]
    # the letters do not fit: the words share the sentence's time by length, in order
    assert words[0].begin_time == sentence.begin_time and words[-1].end_time == sentence.end_time
    assert all(w0.end_time == w1.begin_time for w0, w1 in zip(words, words[1:]))
