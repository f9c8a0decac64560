"""CosyVoice3 end to end, as CosyVoice2's tests run it, on a tiny random CosyVoice3 model from our builder:
the CLI in every mode (streaming, speed), and one `python app.py` split from its LM (--llm_base_url on the
session's real vLLM backend serving the tiny CosyVoice3 LM) through gradio_client, the PAI and OpenAI HTTP
APIs and its page; and the bad input specific to the family (instruct2 without its marker, another family's
saved voice)."""
from __future__ import annotations

import base64
import html
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
import soundfile as sf
import torch
from conftest import ASSETS
from gradio_client import handle_file
from servers import metric, start_apps

from cosy.deploy.voices import VoiceStore
from cosy.prompt.encoder import PromptFeatures

ZS_WAV = ASSETS / "zero_shot_prompt.wav"
CL_WAV = ASSETS / "cross_lingual_prompt.wav"
ZS_TEXT = "希望你以后能够做的比我还好呦。"
TEXT = "今天天气很好，我们一起去公园散步。"
INSTRUCT = "You are a helpful assistant. 请用广东话表达。<|endofprompt|>"  # instruct2: the caller's whole prompt
SPF = 480  # output samples per mel frame at 24 kHz


def run_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cosy", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


def read_wav(path) -> int:
    wav, sr = sf.read(path)
    assert sr == 24000 and len(wav) > 0
    return len(wav)


def test_cli_every_mode(tiny_cv3_model_dir, tmp_path):
    """Every mode once, two processes at a time (each loads the model); the saved voice streams at speed 1.5."""
    common = ("--model_dir", tiny_cv3_model_dir, "--data_dir", tmp_path, "--seed", 2)
    runs = {
        "zero_shot": ("--mode", "zero_shot", "--text", TEXT, "--prompt_text", ZS_TEXT, "--prompt_wav", ZS_WAV,
                      "--save_voice", "cv3-voice"),
        "cross_lingual": ("--mode", "cross_lingual", "--text", "Hello there, how are you?", "--prompt_wav", CL_WAV,
                          "--stream"),
        "instruct": ("--mode", "instruct", "--text", TEXT, "--instruct_text", INSTRUCT, "--prompt_wav", ZS_WAV),
        "vc": ("--mode", "vc", "--prompt_wav", ZS_WAV, "--source_wav", CL_WAV),
        "voice": ("--mode", "voice", "--voice_id", "cv3-voice", "--text", TEXT, "--stream", "--speed", "1.5"),
    }

    def run(name: str) -> subprocess.CompletedProcess:
        return run_cli(*common, *runs[name], "--out", tmp_path / f"{name}.wav")

    with ThreadPoolExecutor(2) as ex:
        done = {name: ex.submit(run, name) for name in ("zero_shot", "cross_lingual", "instruct", "vc")}
        assert done["zero_shot"].result().returncode == 0, done["zero_shot"].result().stderr
        done["voice"] = ex.submit(run, "voice")  # needs the voice zero_shot saved
        done = {name: f.result() for name, f in done.items()}
    for name, r in done.items():
        assert r.returncode == 0, (name, r.stderr)
    n = {name: read_wav(tmp_path / f"{name}.wav") for name in runs}
    assert n["zero_shot"] % SPF == 0 and n["vc"] % SPF == 0
    # the saved voice is zero_shot's prompt: same seed, same tokens; speed 1.5 while streaming shortens each
    # chunk's mel by the factor
    assert abs(n["voice"] - n["zero_shot"] / 1.5) <= 0.1 * n["zero_shot"], (n["voice"], n["zero_shot"])


@pytest.fixture(scope="module")
def split_app(tiny_cv3_model_dir, cv3_backend, tmp_path_factory):
    """One CosyVoice3 frontend whose LM is the vLLM backend: gradio, HTTP APIs and page are all this one."""
    data = tmp_path_factory.mktemp("cv3_data")
    (app,) = start_apps(["--model_dir", str(tiny_cv3_model_dir), "--data_dir", str(data), "--llm_base_url",
                         cv3_backend.url, "--llm_api_key", cv3_backend.api_key])
    app.data = data
    yield app
    app.stop()


@pytest.fixture(scope="module")
def client(split_app):
    return split_app.client()


def backend_requests(backend) -> float:
    text = httpx.get(f"http://127.0.0.1:{backend.port}/metrics", timeout=10).text
    return metric(text, "vllm:request_success_total")


def test_gradio_every_mode_through_the_backend(client, cv3_backend):
    before = backend_requests(cv3_backend)
    assert read_wav(client.predict(TEXT, ZS_TEXT, handle_file(ZS_WAV), 1, 1.0, api_name="/zero_shot")) > 0
    assert read_wav(client.predict("Hello there.", handle_file(CL_WAV), 2, 1.0, api_name="/cross_lingual")) > 0
    assert read_wav(client.predict(TEXT, INSTRUCT, handle_file(ZS_WAV), 3, 1.2, api_name="/instruct")) > 0
    saved = client.predict("cv3-voice", ZS_TEXT, handle_file(ZS_WAV), api_name="/save_voice")
    assert saved["voice_id"] == "cv3-voice"
    listed = {v["voice_id"]: v for v in client.predict(api_name="/list_voices")}
    assert listed["cv3-voice"]["family"] == "cosyvoice3"
    assert read_wav(client.predict(TEXT, "cv3-voice", 1, 1.0, api_name="/saved_voice")) > 0
    assert backend_requests(cv3_backend) >= before + 4  # the LM ran on the backend, once per synthesis


def test_family_specific_bad_input_is_a_clear_message(client, split_app):
    with pytest.raises(Exception) as e:
        client.predict(TEXT, "用四川话说这句话", handle_file(ZS_WAV), 1, 1.0, api_name="/instruct")
    # gradio errors are HTML-escaped (the WebUI renders them as HTML: cosy.frontend.gradio_api.user_errors)
    assert "ends in <|endofprompt|>" in html.unescape(str(e.value)) and "Traceback" not in str(e.value)
    f = PromptFeatures(torch.arange(10, dtype=torch.int32)[None], torch.randn(1, 20, 80), torch.randn(1, 192))
    VoiceStore(split_app.data / "voices").save("v2-voice", ZS_TEXT, f, family="cosyvoice2")
    with pytest.raises(Exception) as e:
        client.predict(TEXT, "v2-voice", 1, 1.0, api_name="/saved_voice")
    assert "was saved with a cosyvoice2 model and this model is cosyvoice3" in str(e.value)
    assert "Traceback" not in str(e.value)


def test_http_apis(split_app, client):
    client.predict("http-voice", ZS_TEXT, handle_file(ZS_WAV), api_name="/save_voice")
    body = {"model": "CosyVoice3", "input": {"mode": "fast_replication", "text": TEXT,
                                             "reference_audio_id": "http-voice"}, "output_format": "pcm", "seed": 5}
    events = []
    with httpx.stream("POST", f"{split_app.url}api/v1/audio/speech", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events and events[-1]["output"]["finish_reason"] == "stop"
    assert len(b"".join(base64.b64decode(e["output"]["audio"]["data"]) for e in events)) > 0
    oa = openai.OpenAI(base_url=f"{split_app.url}v1", api_key="x", max_retries=0)
    wav = oa.audio.speech.create(model="tts-1", voice="http-voice", input=TEXT, response_format="wav",
                                 extra_body={"seed": 5}).content
    path = split_app.data / "openai.wav"
    path.write_bytes(wav)
    assert read_wav(path) > 0


def test_page_names_family_model_and_lm(split_app, tiny_cv3_model_dir):
    config = json.dumps(httpx.get(f"{split_app.url}config", timeout=30).json(), ensure_ascii=False)
    assert f"CosyVoice3 ({tiny_cv3_model_dir.name}) · LM llm.pt" in config
    assert "You are a helpful assistant. 请用四川话说这句话。<|endofprompt|>" in config  # the instruct examples
