"""SSML on every surface of a real HTTP stack (tests/http_stack.py: uvicorn, a worker pool on the tiny model):
the PAI HTTP API (`input.enable_ssml`), OpenAI's route (`enable_ssml`), the PAI and DashScope WebSockets
(`enable_ssml` in run-task, one continue-task; the real dashscope SDK's call()), the OpenAI-style socket
(`enable_ssml` in session.config, one input.text), gradio_client on a real app (`enable_ssml`; a raw call
without it still works) and the CLI (`--ssml`): a break's silence is in the audio, every malformed document
is a 400 (or task-failed) naming its line and column before any audio, a document with nothing to speak is
refused as plain text is, and plain text stays plain where SSML is off."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx
import numpy as np
import pytest
import soundfile as sf
import websockets
from gradio_client import handle_file
from http_stack import KEY, stack  # noqa: F401 -- the module's server fixture
from servers import ROOT, App

BREAK_MS = 400
DOC = f'<speak>你好。<break time="{BREAK_MS}ms"/>再见。</speak>'


@pytest.mark.quick
def test_raw_calls_get_the_defaults_of_parameters_added_later():
    from cosy.frontend import gradio_compat

    def saved_voice(tts_text: str, voice_id: str, seed: int = 0, speed: float = 1.0, enable_ssml: bool = False,
                    request=None):
        pass
    gradio_compat.note(saved_voice, "test_saved_voice")
    four = json.dumps({"data": ["你好", "alice", 0, 1.0], "session_hash": "s"}).encode()
    assert json.loads(gradio_compat.padded("test_saved_voice", four)) == {
        "data": ["你好", "alice", 0, 1.0, False], "session_hash": "s"}
    for body in (b'{"data": ["x", "y", 0]}', b'{"data": ["x", "y", 0, 1.0, true]}', b"not json", b'{"data": 5}'):
        assert gradio_compat.padded("test_saved_voice", body) == body  # too few stays an error; the rest as is


def longest_zero_run(pcm: bytes) -> int:
    x = np.frombuffer(pcm, np.int16)
    best = run = 0
    for v in x == 0:
        run = run + 1 if v else 0
        best = max(best, run)
    return best


def _pai(stack, text: str, stream: bool = False, **options) -> httpx.Response:  # noqa: F811
    body = {"model": "CosyVoice2-0.5B", "stream": stream,
            "input": {"mode": "fast_replication", "text": text, "reference_audio_id": stack.ref, "seed": 3,
                      "output_format": "pcm", **options}}
    return httpx.post(f"{stack.url}/api/v1/audio/speech", json=body, timeout=300)


def _pcm(r: httpx.Response) -> bytes:
    assert r.status_code == 200, r.text
    import base64
    return base64.b64decode(r.json()["output"]["audio"]["data"])


def test_pai_http_speaks_the_break_and_refuses_bad_documents(stack):  # noqa: F811
    pcm = _pcm(_pai(stack, DOC, enable_ssml=True))
    assert longest_zero_run(pcm) >= BREAK_MS * 24  # 24 kHz: the break's samples, exactly zero
    plain = _pai(stack, "<speak>你好。</speak>")  # SSML off: the text is spoken as it is
    assert plain.status_code == 200
    for doc, words in (("<speak>你好", "SSML line 1, column 10: malformed XML"),
                       ('<speak><break time="20s"/>你好</speak>', "SSML line 1, column 8: <break time='20s'>"),
                       ("你好。", "SSML line 1, column 1: the text is not SSML")):
        r = _pai(stack, doc, enable_ssml=True)
        assert r.status_code == 400 and words in r.json()["error"]["message"], r.text


def test_openai_route_takes_enable_ssml(stack):  # noqa: F811
    body = {"model": "tts-1", "voice": stack.ref, "response_format": "pcm", "input": DOC, "enable_ssml": True}
    r = httpx.post(f"{stack.url}/v1/audio/speech", json=body, timeout=300)
    assert r.status_code == 200 and longest_zero_run(r.content) >= BREAK_MS * 24
    r = httpx.post(f"{stack.url}/v1/audio/speech", json={**body, "input": "<speak><p>x</p></speak>"}, timeout=60)
    assert r.status_code == 400 and "SSML line 1, column 8: unknown tag <p>" in r.json()["error"]["message"]


def _ws(stack, path: str, parameters: dict, messages: list[dict]) -> tuple[list[dict], bytes]:  # noqa: F811
    """run-task with `parameters`, then `messages` (continue/finish payloads); the events and binary audio."""
    url = stack.url.replace("http://", "ws://") + path

    def msg(action: str, payload: dict) -> str:
        return json.dumps({"header": {"action": action, "task_id": "t1", "streaming": "duplex"}, "payload": payload})

    async def main():
        events, audio = [], bytearray()
        async with websockets.connect(url) as ws:
            await ws.send(msg("run-task", {"task_group": "audio", "task": "tts", "function": "SpeechSynthesizer",
                                           "model": "cosyvoice-v2", "parameters": parameters, "input": {}}))
            for m in messages:
                await ws.send(msg(m["action"], {"input": m.get("input", {})}))
            while True:
                got = await asyncio.wait_for(ws.recv(), 300)
                if isinstance(got, bytes):
                    audio.extend(got)
                    continue
                events.append(json.loads(got))
                if events[-1]["header"]["event"] in ("task-finished", "task-failed"):
                    return events, bytes(audio)

    return asyncio.run(main())


def test_pai_and_dashscope_sockets_take_one_ssml_document(stack):  # noqa: F811
    cont = {"action": "continue-task", "input": {"text": DOC}}
    fin = {"action": "finish-task"}
    pai = {"mode": "fast_replication", "reference_audio_id": stack.ref, "output_format": "pcm", "seed": 3,
           "enable_ssml": True, "binary_audio": True}
    events, audio = _ws(stack, "/api-ws/v1/audio/speech", pai, [cont, fin])
    assert events[-1]["header"]["event"] == "task-finished" and longest_zero_run(audio) >= BREAK_MS * 24
    events, _ = _ws(stack, "/api-ws/v1/audio/speech", pai, [cont, cont, fin])  # one continue-task, as published
    assert events[-1]["header"]["event"] == "task-failed"
    assert "comes whole in one continue-task" in events[-1]["header"]["error_message"]
    bad = {"action": "continue-task", "input": {"text": "<speak>x<break/></speak>"}}
    events, audio = _ws(stack, "/api-ws/v1/audio/speech", pai, [bad, fin])
    assert events[-1]["header"]["error_message"].startswith("SSML line 1, column 9: <break> needs a time") and not audio
    dash = {"voice": stack.ref, "format": "pcm", "sample_rate": 24000, "enable_ssml": True}
    events, audio = _ws(stack, "/api-ws/v1/inference", dash, [cont, fin])
    assert events[-1]["header"]["event"] == "task-finished" and longest_zero_run(audio) >= BREAK_MS * 24


def _openai_ws(stack, config: dict, deltas: list[str]) -> tuple[list[dict], bytes]:  # noqa: F811
    """session.config with `config`, the deltas, input.done: the events (audio deltas decoded) and the audio."""
    import base64

    async def main():
        async with websockets.connect(stack.url.replace("http://", "ws://") + "/v1/audio/speech/stream",
                                      max_size=None) as ws:
            await ws.send(json.dumps({"type": "session.config", "voice": stack.ref, "response_format": "pcm",
                                      "seed": 3, **config}))
            assert json.loads(await ws.recv())["type"] == "session.created"
            for d in deltas:
                await ws.send(json.dumps({"type": "input.text", "delta": d}))
            await ws.send(json.dumps({"type": "input.done"}))
            events = []
            while not events or events[-1]["type"] not in ("speech.audio.done", "error"):
                events.append(json.loads(await asyncio.wait_for(ws.recv(), 300)))
            return events, b"".join(base64.b64decode(e["audio"]) for e in events if "audio" in e)

    return asyncio.run(main())


def test_the_openai_socket_takes_enable_ssml(stack):  # noqa: F811
    """session.config's enable_ssml (ignored before: the tags were read aloud): the one input.text is a
    document, its break's silence in the audio; a malformed one is an error naming its place, before audio."""
    events, audio = _openai_ws(stack, {"enable_ssml": True}, [DOC])
    assert events[-1]["type"] == "speech.audio.done" and longest_zero_run(audio) >= BREAK_MS * 24
    events, audio = _openai_ws(stack, {"enable_ssml": True}, ["<speak>x<break/></speak>"])
    assert events[-1]["type"] == "error" and not audio
    assert events[-1]["error"]["code"] == "invalid_parameter"
    assert events[-1]["error"]["message"].startswith("SSML line 1, column 9: <break> needs a time")
    events, _ = _openai_ws(stack, {"enable_ssml": True}, [DOC, "再见。"])
    assert events[-1]["type"] == "error" and "comes whole in one input.text" in events[-1]["error"]["message"]
    events, audio = _openai_ws(stack, {}, [DOC])  # without it: plain text (the tags are text)
    assert events[-1]["type"] == "speech.audio.done" and longest_zero_run(audio) < BREAK_MS * 24


NOTHING = ["<speak>。，！？</speak>", '<speak><break time="300ms"/>。</speak>', '<speak><break time="300ms"/></speak>',
           '<speak><sub alias="！">x</sub></speak>']


def test_a_document_with_nothing_to_speak_is_refused_as_plain_text_is(stack):  # noqa: F811
    """`<speak>。，！？</speak>` gave 200 and an empty WAV (a <break> only its silence) where the same text
    without SSML is a 400 "nothing to speak": the same rule for both, before any audio, on every surface."""
    plain = _pai(stack, "。，！？")
    assert plain.status_code == 400 and "nothing to speak" in plain.json()["error"]["message"], plain.text
    pai = {"mode": "fast_replication", "reference_audio_id": stack.ref, "output_format": "pcm", "seed": 3,
           "enable_ssml": True, "binary_audio": True}
    dash = {"voice": stack.ref, "format": "pcm", "sample_rate": 24000, "enable_ssml": True}
    for doc in NOTHING:
        for stream in (False, True):
            r = _pai(stack, doc, enable_ssml=True, stream=stream)
            assert r.status_code == 400 and "nothing to speak" in r.json()["error"]["message"], (doc, stream, r.text)
        body = {"model": "tts-1", "voice": stack.ref, "response_format": "wav", "input": doc, "enable_ssml": True}
        r = httpx.post(f"{stack.url}/v1/audio/speech", json=body, timeout=300)
        assert r.status_code == 400 and "nothing to speak" in r.json()["error"]["message"], (doc, r.text)
        for path, params in (("/api-ws/v1/audio/speech", pai), ("/api-ws/v1/inference", dash)):
            events, audio = _ws(stack, path, params, [{"action": "continue-task", "input": {"text": doc}},
                                                      {"action": "finish-task"}])
            header = events[-1]["header"]
            assert header["event"] == "task-failed" and not audio, (doc, path, header)
            assert header["error_code"] == "InvalidParameter" and "nothing to speak" in header["error_message"]
            assert [e["header"]["event"] for e in events[:-1]] in ([], ["task-started"]), (doc, path, events)
        events, audio = _openai_ws(stack, {"enable_ssml": True}, [doc])
        assert events[-1]["type"] == "error" and "nothing to speak" in events[-1]["error"]["message"] and not audio


def test_the_dashscope_sdks_call_with_ssml_and_with_plain_text(stack):  # noqa: F811
    """The SDK's call() sets enable_ssml on every call: SSML is read as SSML, plain text stays plain."""
    import dashscope
    from dashscope.audio.tts_v2 import AudioFormat, SpeechSynthesizer

    dashscope.base_websocket_api_url = stack.keyed.replace("http://", "ws://") + "/api-ws/v1/inference"
    dashscope.api_key = KEY
    for text in (DOC, "你好。"):
        synth = SpeechSynthesizer(model="cosyvoice-v2", voice=stack.ref, format=AudioFormat.PCM_24000HZ_MONO_16BIT)
        audio = synth.call(text, timeout_millis=300_000)
        assert audio and len(audio) % 2 == 0
        assert (longest_zero_run(audio) >= BREAK_MS * 24) == (text == DOC)


def test_gradio_client_and_cli_take_ssml(tiny_model_dir, tmp_path):
    app = App("--model_dir", str(tiny_model_dir), "--data_dir", str(tmp_path / "data")).wait()
    try:
        client = app.client()
        prompt = handle_file(str(ROOT / "assets" / "cross_lingual_prompt.wav"))
        path = client.predict(DOC, prompt, 3, 1.0, True, api_name="/cross_lingual")
        assert longest_zero_run(sf.read(path, dtype="int16")[0].tobytes()) >= BREAK_MS * 24
        with pytest.raises(Exception, match="SSML line 1, column 1"):
            client.predict("你好", prompt, 3, 1.0, True, api_name="/cross_lingual")
        # the message as it was written (it was HTML-escaped for every caller: "unknown tag &lt;p&gt;")
        with pytest.raises(Exception, match="SSML line 1, column 8: unknown tag <p> "):
            client.predict("<speak><p>x</p></speak>", prompt, 3, 1.0, True, api_name="/cross_lingual")
        for doc in NOTHING[:2]:
            with pytest.raises(Exception, match="nothing to speak"):
                client.predict(doc, prompt, 3, 1.0, True, api_name="/cross_lingual")
        path = client.predict(DOC, prompt, 3, 1.0, api_name="/cross_lingual")  # the default: plain text
        assert longest_zero_run(sf.read(path, dtype="int16")[0].tobytes()) < BREAK_MS * 24
        # a raw call written before enable_ssml existed (four values) still speaks (cosy.frontend.gradio_compat)
        wav = ROOT / "assets" / "cross_lingual_prompt.wav"
        up = httpx.post(app.url + "gradio_api/upload", files={"files": (wav.name, wav.read_bytes())}, timeout=30)
        file = {"path": up.json()[0], "orig_name": wav.name, "meta": {"_type": "gradio.FileData"}}
        for data, ends in ((["你好。", file, 3, 1.0], "event: complete"), (["你好。", file, 3], "event: error")):
            r = httpx.post(app.url + "gradio_api/call/cross_lingual", json={"data": data}, timeout=30)
            with httpx.stream("GET", app.url + f"gradio_api/call/cross_lingual/{r.json()['event_id']}",
                              timeout=120) as events:
                text = "".join(events.iter_text())
            assert ends in text, text[-500:]
    finally:
        app.stop()
    out = tmp_path / "cli.wav"
    run = [sys.executable, "-m", "cosy", "--model_dir", str(tiny_model_dir), "--mode", "cross_lingual", "--prompt_wav",
           str(ROOT / "assets" / "cross_lingual_prompt.wav"), "--seed", "3", "--ssml", "--out", str(out), "--text"]
    r = subprocess.run([*run, DOC], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert longest_zero_run(sf.read(out, dtype="int16")[0].tobytes()) >= BREAK_MS * 24
    out.unlink()
    r = subprocess.run([*run, "<speak>x</speek>"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "error: SSML line 1, column" in r.stderr and "mismatched tag" in r.stderr, r.stderr
    assert not out.exists()  # nothing written
