"""CosyVoice3's LM half: the family facts, golden audio/text/LM cases, the stop set and min-len quirk, the
silent-token rule and the prompt formats per mode."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import GOLDEN_CV3, STATE_DICT_LIST_CV3, reference_entries, reference_shapes
from torch import nn

from cosy.lm.model import SpeechLM
from cosy.lm.sampling import SamplingParams
from cosy.lm.silence import drop_long_silence
from cosy.model import families
from cosy.model.families.cosyvoice2 import FAMILY as CV2
from cosy.model.families.cosyvoice3 import FAMILY as CV3
from cosy.model.family import import_object
from cosy.model.files import ModelDir, ModelDirError
from cosy.pipeline.lm_input import lm_input
from cosy.pipeline.request import SynthesisError
from cosy.text.frontend import TextFrontend
from cosy.text.tokenizer import TextTokenizer

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")


@pytest.fixture(scope="module")
def lm() -> SpeechLM:
    return SpeechLM.from_model_dir(GOLDEN_CV3 / "model")


@pytest.fixture(scope="module")
def text() -> TextFrontend:
    return TextFrontend(TextTokenizer.from_dir(GOLDEN_CV3 / "model" / CV3.files.qwen_dir,
                                               import_object(CV3.text_specials)))


def test_golden_audio_text_and_lm_cases_pass():
    """Every audio, text and LM case (bistream included) of the official CosyVoice3 fixtures within its tolerance."""
    r = subprocess.run([sys.executable, "-m", "cosy.golden_check", str(GOLDEN_CV3), "--kinds", "audio,text,lm"],
                       capture_output=True, text=True, timeout=600)
    rows = [line for line in r.stdout.splitlines()[1:] if line.strip()]
    failed = [row for row in rows if not row.endswith("PASS")]
    assert r.returncode == 0 and failed == [], r.stdout
    # the bistream case: same yielded tokens, the same official forward steps, their log-probs and inputs
    assert {row.split()[0] for row in rows if row.startswith("lm.bistream.")} == {
        f"lm.bistream.{k}" for k in ("yielded_tokens", "steps", "logp", "last_hidden", "step0_input", "inputs_concat")}
    meta = json.loads((GOLDEN_CV3 / "cases.json").read_text())
    names = " ".join(row.split()[0] for row in rows)
    for case in meta["cases"]:
        if case["name"].split(".")[0] in ("audio", "text", "lm"):
            assert case["name"] in names
    for row in rows:
        if row.endswith("PASS"):
            *_, diff, tol, _ = row.split()
            assert float(diff) <= float(tol)
    # exact text results: 13 encodes + 6 decodes + the special-token table; 15 inputs x 3; 6 calls x 3
    for line in ("text.tokenizer_encode (20/20 exact)", "text.text_normalize (45/45 exact)",
                 "text.frontend_modes (18/18 exact)"):
        assert line in r.stdout


def test_family_facts():
    md = ModelDir(GOLDEN_CV3 / "model")
    assert md.family is CV3 is families.get("cosyvoice3")
    t = CV3.tokens
    assert (t.size, t.vocab, t.eos, t.fill, t.min_len_mask) == (6561, 6761, 6562, 6564, 6561)
    assert t.stop == tuple(range(6561, 6761))
    assert (CV3.sos.table, CV3.sos.row, CV3.task_id.table, CV3.task_id.row) == ("speech_embedding", 6561,
                                                                                 "speech_embedding", 6563)
    assert CV3.files.llm_file("rl") == "llm.rl.pt" and CV3.files.llm_file(None) == "llm.pt"
    with pytest.raises(ValueError, match="unknown LM variant 'sft'.*default, rl"):
        CV3.files.llm_file("sft")
    with pytest.raises(ValueError, match="unknown LM variant 'rl'"):
        CV2.files.llm_file("rl")
    assert md.config.llm_input_size == 64 and md.config.sampling.top_k == 25
    with pytest.raises(ModelDirError, match="llm.rl.pt is missing: the LM variant 'rl' is that file beside llm.pt"):
        SpeechLM.from_model_dir(md, variant="rl")


def test_lm_has_no_llm_embedding_and_no_head_bias(lm):
    names = dict(lm.named_parameters())
    assert "llm_embedding.weight" not in names and "llm_decoder.bias" not in names
    assert lm.llm_decoder.weight.shape == (6761, 64) and lm.speech_embedding.weight.shape == (6761, 64)


def _favouring(lm: SpeechLM, token: int) -> SpeechLM:
    """A copy of the LM whose head makes `token` the argmax at every step (the decoder row is made huge
    along the direction of the final norm's typical output)."""
    lm2 = SpeechLM(lm.cfg, lm.family)
    lm2.load_state_dict(lm.state_dict())
    w = lm2.llm_decoder.weight.detach().clone()
    probe = lm.prompt_embeds([2610, 151646], [], [])
    _, h = lm.teacher_forced_logprobs(probe, [0])
    w[token] = h[0] * 1e3
    lm2.llm_decoder.weight = nn.Parameter(w)
    return lm2.eval()


def test_eos_is_never_blocked_but_sos_is_below_min_len(lm):
    """Quirk: below min_len the official sampler masks 6561 (sos), so eos 6562 still ends the output."""
    greedy = SamplingParams(greedy=True)
    prompt = lm.prompt_embeds([2610, 525, 151646], [], [])
    assert list(_favouring(lm, 6562).generate(prompt, min_len=5, max_len=20, params=greedy)) == []
    tokens = list(_favouring(lm, 6561).generate(prompt, min_len=3, max_len=20, params=greedy))
    assert len(tokens) == 3 and all(t < 6561 for t in tokens)  # masked 3 times, then sos stops
    # every id of 6561..6760 stops, unused ones too
    assert list(_favouring(lm, 6700).generate(prompt, min_len=5, max_len=20, params=greedy)) == []


def test_silent_runs_are_cut_after_five():
    silent = CV3.tokens.silent
    s = silent[0]
    seq = [7, s, s, s, s, s, s, s, 9, s, 2242, 2241, 1, 2, 28, 29, 3]
    assert list(drop_long_silence(iter(seq), CV3.tokens)) == [7, s, s, s, s, s, 9, s, 2242, 2241, 1, 2, 3]
    assert list(drop_long_silence(iter(seq), CV2.tokens)) == seq  # CosyVoice2 has no silent tokens

    closed = []

    def source():
        try:
            yield from seq
        finally:
            closed.append(True)

    gen = drop_long_silence(source(), CV3.tokens)
    next(gen)
    gen.close()
    assert closed == [True]  # closing the filter closes the LM stream (a remote request is aborted)


def test_prompt_formats_per_mode(text):
    speech = [5, 6, 7]
    zs = lm_input(text, CV3, "zero_shot", "你好。", "希望你以后能够做的比我还好呦。", speech_tokens=speech)
    assert text.tokenizer.decode(zs.prompt_text, skip_special_tokens=False).startswith(
        "You are a helpful assistant.<|endofprompt|>希望")
    assert zs.prompt_speech == speech
    xl = lm_input(text, CV3, "cross_lingual", "Hello 2 you. And more.", speech_tokens=speech)
    assert xl.prompt_text == [] and xl.prompt_speech == []
    # one segment, not normalized (the digit stays a digit), led by the system prompt
    assert [s for s, _ in xl.segments] == ["You are a helpful assistant.<|endofprompt|>Hello 2 you. And more."]
    ins = lm_input(text, CV3, "instruct", "你好。", speech_tokens=speech,
                   instruct_text="You are a helpful assistant. 请用广东话表达。<|endofprompt|>")
    assert ins.prompt_speech == [] and ins.prompt_text[-1] == 151646 and ins.prompt_text[:6] == zs.prompt_text[:6]
    with pytest.raises(SynthesisError, match="cosyvoice3 instruction .* ends in <\\|endofprompt\\|>, e.g. 'You are"):
        lm_input(text, CV3, "instruct", "你好。", instruct_text="请用广东话表达。")
    # CosyVoice2 appends the marker and has no system prompt
    cv2 = lm_input(text, CV2, "instruct", "你好。", instruct_text="用粤语说这句话")
    assert cv2.prompt_text[-1] == 151646
    assert lm_input(text, CV2, "cross_lingual", "Hello 2 you.").segments[0][0] == "Hello two you . ."  # normalized


# ---------------------------------------------------------------- random model builder, official key layout

@pytest.fixture(scope="module")
def tiny3(tmp_path_factory):
    from cosy.verify.random_model import write_random_model
    return write_random_model(tmp_path_factory.mktemp("tiny3"), "tiny", seed=1, family="cosyvoice3")


def test_full_size_lm_keys_and_shapes_match_official_list():
    from cosy.lm.config import LMConfig
    from cosy.lm.model import LM_HEAD_KEY

    with torch.device("meta"):
        lm = SpeechLM(LMConfig(speech_vocab=CV3.tokens.vocab), CV3)
    ours = {k: tuple(v.shape) for k, v in lm.state_dict().items()}
    ref = reference_shapes("llm", STATE_DICT_LIST_CV3)
    assert ref.pop(LM_HEAD_KEY) == ref["llm.model.model.embed_tokens.weight"] == (151936, 896)
    assert ours == ref
    assert sum(v.numel() for v in lm.parameters()) == 506148480  # the list's count (the tied head once)


def test_builder_writes_official_llm_keys_and_loads_strictly(tiny3):
    sd = torch.load(tiny3 / "llm.pt", weights_only=True)
    ref = [k for k, _, _ in reference_entries("llm", STATE_DICT_LIST_CV3)
           if not k.startswith("llm.model.model.layers.") or int(k.split(".")[4]) < 2]
    assert list(sd) == ref  # same keys, same order as the official file
    assert sd["speech_embedding.weight"].shape == sd["llm_decoder.weight"].shape == (6761, 64)
    md = ModelDir(tiny3)
    assert md.family is CV3 and md.missing() in ([], ["flow.pt", "hift.pt"])  # the speech half is another writer's
    assert (tiny3 / "speech_tokenizer_v3.onnx").is_file() and (tiny3 / "CosyVoice-BlankEN" / "vocab.json").is_file()
    lm = SpeechLM.from_model_dir(md)  # strict
    x = lm.prompt_embeds([2610, 151646, 99880], [], [3, 4])
    assert x.shape == (1, 7, 64)
    rows = sd["speech_embedding.weight"]
    assert torch.equal(x[0, 0], rows[6561]) and torch.equal(x[0, 4], rows[6563])  # sos, task_id
    again = list(lm.generate(x, 2, 30, seed=3))
    assert again == list(lm.generate(x, 2, 30, seed=3)) and all(t < 6561 for t in again)
    # the yaml reads back with the sizes filled in
    from cosy.model.hyperyaml import load_hyperyaml
    doc = load_hyperyaml(tiny3 / "cosyvoice3.yaml")
    assert doc["llm_input_size"] == 64 and doc["flow"]["decoder"]["estimator"]["depth"] == 2


def test_cosyvoice3_hub_id_downloads_and_incomplete_dirs_name_it(tiny3, tmp_path):
    from cosy.deploy.models import COSYVOICE3_MODEL, HF_IDS, resolve_model_dir

    assert HF_IDS[COSYVOICE3_MODEL] == COSYVOICE3_MODEL == "FunAudioLLM/Fun-CosyVoice3-0.5B-2512"
    fetched = []

    def download(model_id: str, local_dir: Path) -> None:  # the hub, played by a copy of the built directory
        fetched.append(model_id)
        shutil.copytree(tiny3, local_dir, dirs_exist_ok=True)
        for name in ("flow.pt", "hift.pt"):  # the speech half is another writer's; only presence is checked
            (local_dir / name).touch()

    path = resolve_model_dir(COSYVOICE3_MODEL, tmp_path / "models", download=download, progress=False)
    assert path == tmp_path / "models" / COSYVOICE3_MODEL and fetched == [COSYVOICE3_MODEL]
    assert ModelDir(path).family is CV3
    (path / "speech_tokenizer_v3.onnx").unlink()
    with pytest.raises(ModelDirError, match="not a complete CosyVoice3 model directory: missing "
                                            "speech_tokenizer_v3.onnx.*FunAudioLLM/Fun-CosyVoice3-0.5B-2512"):
        resolve_model_dir(str(path))


def test_rl_variant_is_loaded_exported_and_embedded_from_its_own_file(tiny3, tmp_path):
    from safetensors import safe_open

    from cosy.lm.export import export_for_vllm, llm_fingerprint
    from cosy.lm.prompt import PromptEmbedder

    d = tmp_path / "m"
    shutil.copytree(tiny3, d)
    sd = torch.load(d / "llm.pt", weights_only=True)
    sd["speech_embedding.weight"] = sd["speech_embedding.weight"] + 1.0  # an "RL-tuned" LM: other weights
    sd["llm_decoder.weight"] = -sd["llm_decoder.weight"]
    torch.save(sd, d / "llm.rl.pt")
    base, rl = SpeechLM.from_model_dir(d), SpeechLM.from_model_dir(d, variant="rl")
    assert torch.equal(rl.speech_embedding.weight, sd["speech_embedding.weight"])
    args = ([2610, 151646, 99880], [], [3, 4])
    assert torch.equal(PromptEmbedder.from_model_dir(d)(*args), base.prompt_embeds(*args))
    assert torch.equal(PromptEmbedder.from_model_dir(d, "rl")(*args), rl.prompt_embeds(*args))
    assert not torch.equal(base.prompt_embeds(*args), rl.prompt_embeds(*args))
    cache = tmp_path / "cache"
    assert llm_fingerprint(d, cache, "rl") != llm_fingerprint(d, cache)
    out = export_for_vllm(d, cache, "rl")
    assert out != export_for_vllm(d, cache)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor("lm_head.weight"), sd["llm_decoder.weight"])
