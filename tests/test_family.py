"""Model families: detection by yaml name, clear errors, and a second family that every layer follows."""
from __future__ import annotations

import dataclasses
import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace

import pytest
import torch
from conftest import GOLDEN
from servers import free_port

from cosy.lm.export import export_for_vllm, llm_fingerprint, served_model_name, vllm_config
from cosy.lm.model import SpeechLM
from cosy.lm.remote import BackendError, RemoteLM
from cosy.lm.sampling import SamplingParams, ras_distribution, ras_sample
from cosy.model import families
from cosy.model.config import read_model_config
from cosy.model.families.cosyvoice2 import FAMILY as CV2
from cosy.model.family import SpeechTokens
from cosy.model.files import ModelDir, ModelDirError

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")

# A made-up family: another yaml and tokenizer name, and other special ids in the same 6564-row vocabulary
# (eos 6563 is the only stop id; 6561 and 6562 are ordinary outputs), so the tiny CosyVoice2 weights serve it.
TEST = dataclasses.replace(
    CV2, name="testvoice", files=dataclasses.replace(CV2.files, yaml="testvoice.yaml", speech_tokenizer="tok.onnx"),
    tokens=SpeechTokens(size=6561, vocab=6564, eos=6563, stop=(6563,), fill=6562, min_len_mask=6563),
    vllm_architecture="TestVoiceForCausalLM", served_name_prefix="testvoice", max_token_text_ratio=3)


@pytest.fixture
def registered():
    families.register(TEST)
    yield TEST
    families.unregister(TEST.name)


def _as(family, src, dst, bias: dict[int, float] | None = None):
    """A copy of model dir `src` laid out for `family` (CosyVoice2 file names renamed), llm_decoder.bias edited."""
    shutil.copytree(src, dst)
    for old, new in zip(CV2.files.all, family.files.all):
        if old != new:
            (dst / old).rename(dst / new)
    if bias:
        sd = torch.load(dst / family.files.llm, weights_only=True)
        for token, value in bias.items():
            sd["llm_decoder.bias"][token] = value
        torch.save(sd, dst / family.files.llm)
    return dst


def test_cosyvoice2_is_detected_from_its_yaml(tmp_path):
    assert families.get("cosyvoice2") is CV2 and CV2 in families.families()
    md = ModelDir(GOLDEN / "model")
    assert md.family is CV2 and md.config.speech_token_size == CV2.tokens.size
    (tmp_path / "cosyvoice2.yaml").write_text((GOLDEN / "model" / "cosyvoice2.yaml").read_text())
    assert ModelDir(tmp_path).family is CV2
    assert ModelDir(tmp_path).missing() == list(CV2.files.all[1:])
    assert CV2.tokens.vocab == 6564 and CV2.tokens.stop == (6561, 6562, 6563)
    marked = "用粤语说<|endofprompt|>"
    assert CV2.instruct_prompt("用粤语说") == marked == CV2.instruct_prompt(marked)


def test_unknown_directory_names_the_yamls_looked_for(tmp_path):
    (tmp_path / "cosyvoice9.yaml").write_text("sample_rate: 24000\n")
    md = ModelDir(tmp_path)
    with pytest.raises(ModelDirError, match=r"is not a known model directory: it holds none of cosyvoice2\.yaml"):
        md.family
    with pytest.raises(ModelDirError, match=r"llm\.pt is missing, and .* none of cosyvoice2\.yaml"):
        md.file("llm.pt")
    assert md.missing() == ["cosyvoice2.yaml or cosyvoice3.yaml"]
    with pytest.raises(ValueError, match="not the yaml of a known model family"):
        read_model_config(tmp_path / "cosyvoice9.yaml")
    with pytest.raises(KeyError, match="unknown model family 'cosyvoice9'"):
        families.get("cosyvoice9")


def test_registering_a_clashing_family_fails():
    with pytest.raises(ValueError, match="clashes with 'cosyvoice2'"):
        families.register(dataclasses.replace(CV2, name="other"))  # same yaml name
    families.register(CV2)  # the same object again: a no-op


def test_a_second_family_is_followed_by_every_layer(registered, tiny_model_dir, tmp_path):
    d = _as(TEST, tiny_model_dir, tmp_path / "t", bias={6561: 40.0, 6562: -40.0, 6563: -40.0})
    cv2_dir = _as(CV2, tiny_model_dir, tmp_path / "c", bias={6561: 40.0, 6562: -40.0, 6563: -40.0})
    md = ModelDir(d)
    assert md.family is TEST and md.missing() == [] and md.config.speech_token_size == 6561
    with pytest.raises(ModelDirError, match=r"x\.bin is missing: .* complete testvoice model directory "
                                            r"\(expected testvoice\.yaml, llm\.pt, .*tok\.onnx"):
        md.file("x.bin")

    # the sampler masks the family's min_len id: 6563 here, 6561 for CosyVoice2
    logits = torch.full((6564,), -10.0)
    logits[[5, 6561, 6563]] = torch.tensor([1.0, 9.0, 8.0])
    greedy = SamplingParams(greedy=True)
    g = torch.Generator().manual_seed(0)
    assert ras_sample(logits, [], greedy, g, mask_eos=True, tokens=TEST.tokens) == 6561
    assert ras_sample(logits, [], greedy, g, mask_eos=True, tokens=CV2.tokens) == 6563
    assert ras_distribution(logits, [], SamplingParams(), True, tokens=TEST.tokens)[6563] == 0

    # the LM: 6561 (almost certain) ends CosyVoice2's output, but is an ordinary token of the test family
    lm, cv2_lm = SpeechLM.from_model_dir(d), SpeechLM.from_model_dir(cv2_dir)
    assert lm.family is TEST and lm.length_limits(10) == (20, 30)
    x = lm.prompt_embeds([1, 2, 3])
    assert list(cv2_lm.generate(x, 0, 8, seed=0, params=greedy)) == []
    assert list(lm.generate(x, 0, 8, seed=0, params=greedy)) == [6561] * 8

    # the vLLM export: architecture, family name, served name and export directory
    cfg = vllm_config(md)
    got = (cfg["architectures"], cfg["cosy_family"], cfg["vocab_size"])
    assert got == (["TestVoiceForCausalLM"], "testvoice", 6564)
    fp = llm_fingerprint(d, tmp_path / "cache")
    assert served_model_name(fp, TEST) == "testvoice-" + fp[:16]
    out = export_for_vllm(d, tmp_path / "cache")
    assert out.name == "testvoice-" + fp and json.loads((out / "config.json").read_text())["cosy_family"] == "testvoice"


class _Completions(BaseHTTPRequestHandler):
    """An OpenAI completions stream of fixed token ids, like vLLM's with return_token_ids."""

    tokens: list[int] = []

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i, token in enumerate(self.tokens):
            last = i == len(self.tokens) - 1
            chunk = {"id": "c", "object": "text_completion", "created": 0, "model": "m",
                     "choices": [{"index": 0, "text": "", "token_ids": [token],
                                  "finish_reason": "stop" if last else None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args):
        pass


@pytest.fixture
def completions():
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Completions)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def test_remote_client_stops_and_validates_by_family(registered, completions):
    url = f"http://127.0.0.1:{completions.server_port}/v1"
    x = torch.zeros(1, 3, 8)
    _Completions.tokens = [5, 6561, 6563]
    assert list(RemoteLM(url, "k", "m", retries=0, family=CV2).generate(x, 0, 10, seed=0)) == [5]
    assert list(RemoteLM(url, "k", "m", retries=0, family=TEST).generate(x, 0, 10, seed=0)) == [5, 6561]
    _Completions.tokens = [5, 6564]
    with pytest.raises(BackendError, match="invalid speech token 6564: is it serving a testvoice model"):
        list(RemoteLM(url, "k", "m", retries=0, family=TEST).generate(x, 0, 10, seed=0))


def test_vllm_logits_processor_reads_the_family_of_the_export(registered, tiny_model_dir, tmp_path):
    from cosy.vllm_plugin import hide_torch_addons

    hide_torch_addons()
    pytest.importorskip("vllm")
    from transformers import AutoConfig

    from cosy.vllm_plugin.ras import CosyLogitsProcessor, served_family

    out = export_for_vllm(_as(TEST, tiny_model_dir, tmp_path / "t"), tmp_path / "cache")
    hf_config = AutoConfig.from_pretrained(out)  # what vLLM hands the processor, from config.json
    assert served_family(hf_config) is TEST
    hf_config.cosy_family = None  # an export without the key: found by its architecture
    assert served_family(hf_config) is TEST
    proc = CosyLogitsProcessor(SimpleNamespace(model_config=SimpleNamespace(hf_config=hf_config)),
                               torch.device("cpu"), False)
    assert proc.tokens is TEST.tokens and proc.stop.tolist() == [6563]
    with pytest.raises(ValueError, match="not a cosy export"):
        served_family(SimpleNamespace(architectures=["Qwen2ForCausalLM"]))
