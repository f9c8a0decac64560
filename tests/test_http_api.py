"""The frontend's HTTP APIs over real HTTP: PAI-compatible routes, OpenAI's /v1/audio/speech (the official
client), encoders checked with independent decoders, auth, errors, 404 beside a mounted Gradio, 429.

One uvicorn server per app in a thread, a real FrontendService over a real WorkerPool on the tiny model
and a real DataDir. The open app mounts Gradio before `install`, the keyed app after: both orders work.
"""
from __future__ import annotations

import base64
import io
import json
import socket
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import av
import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
import torch
from conftest import ASSETS

from cosy.audio.resample import resample
from cosy.frontend.audio_out import StreamResampler
from cosy.frontend.service import FrontendService
from cosy.service.workers import EngineSpec, WorkerPool
from launch.data_dir import DataDir

ZS_WAV = ASSETS / "zero_shot_prompt.wav"
ZS_TEXT = "希望你以后能够做的比我还好呦。"
SHORT = "你好，世界。"
MEDIUM = "今天天气很好，我们一起去公园散步。"  # three streaming chunks
LONG = "今天天气很好，我们一起去公园散步，看看花草树木。" * 2
KEY = "s3cret-key"
RATE = 24000


def _app(service, api_key, ready, gradio_first: bool):
    import gradio as gr
    from fastapi import FastAPI

    from cosy.frontend.http_api import install

    app = FastAPI()
    with gr.Blocks() as blocks:
        gr.Markdown("cosy test page")
    if gradio_first:
        app = gr.mount_gradio_app(app, blocks, path="/")
        install(app, service, api_key=api_key, ready=ready)
    else:
        install(app, service, api_key=api_key, ready=ready)
        app = gr.mount_gradio_app(app, blocks, path="/")
    return app


def _serve(app):
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(scope="module")
def stack(tiny_model_dir, tmp_path_factory):
    pool = WorkerPool(EngineSpec(str(tiny_model_dir)), workers=1, max_queue=8).start()
    data = DataDir(tmp_path_factory.mktemp("data"))
    service = FrontendService(pool, data)
    state = {"ready": (True, "models loaded")}
    servers = [_serve(_app(service, None, lambda: state["ready"], gradio_first=True)),
               _serve(_app(service, KEY, lambda: (True, "ok"), gradio_first=False))]
    url, keyed = servers[0][2], servers[1][2]
    r = httpx.post(f"{url}/api/v1/audio/reference_audio", files={"file": ("prompt.wav", ZS_WAV.read_bytes())},
                   data={"text": ZS_TEXT}, timeout=60)
    assert r.status_code == 200, r.text
    yield SimpleNamespace(url=url, keyed=keyed, pool=pool, service=service, data=data, state=state,
                          ref=r.json()["id"], client=openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0))
    for server, thread, _ in servers:
        server.should_exit = True
        thread.join(10)
    pool.close()


def _error(r: httpx.Response, status: int, type_: str, *words: str) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == status and err["type"] == type_, err
    for w in words:
        assert w in err["message"], err["message"]
    return err


def _decode(fmt: str, data: bytes) -> tuple[int, int]:
    """(samples, rate) by decoders other than our encoders: libsndfile, and ffmpeg's decoder for aac."""
    if fmt == "pcm":
        return len(data) // 2, RATE
    if fmt == "aac":
        with av.open(io.BytesIO(data)) as c:
            frames = list(c.decode(audio=0))
        return sum(f.samples for f in frames), frames[0].sample_rate
    audio, rate = sf.read(io.BytesIO(data))
    return len(audio), rate


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# --- OpenAI-compatible ---------------------------------------------------------------------------------------

def test_openai_client_every_format_decodes_to_the_right_length(stack):
    pcm = stack.client.audio.speech.create(model="tts-1", voice=stack.ref, input=SHORT, response_format="pcm",
                                           extra_body={"seed": 7}).content
    expected = len(pcm) // 2
    assert expected > RATE // 2
    assert np.abs(np.frombuffer(pcm, "<i2")).max() > 0
    mp3 = stack.client.audio.speech.create(model="tts-1", voice=stack.ref, input=SHORT, extra_body={"seed": 7})
    assert mp3.response.headers["content-type"] == "audio/mpeg"  # mp3 is the default, as at OpenAI
    results = {"mp3": mp3.content}
    for fmt in ("opus", "aac", "flac", "wav"):
        results[fmt] = stack.client.audio.speech.create(model="tts-1", voice={"id": stack.ref}, input=SHORT,
                                                        response_format=fmt, extra_body={"seed": 7}).content
    for fmt, data in results.items():
        n, rate = _decode(fmt, data)
        assert rate == RATE, fmt
        # lossy codecs add encoder delay/padding (a few frames), never more than 0.15 s here
        assert abs(n - expected) <= (0 if fmt in ("wav", "flac") else 0.15 * RATE), (fmt, n, expected)


def test_openai_streaming_response_arrives_in_chunks(stack):
    start, arrivals, data = time.monotonic(), [], b""
    with stack.client.audio.speech.with_streaming_response.create(
            model="tts-1", voice=stack.ref, input=MEDIUM, response_format="wav", extra_body={"seed": 3}) as r:
        assert r.headers["content-type"] == "audio/wav" and r.headers["x-cosy-speed"] == "1"
        for chunk in r.iter_bytes():
            arrivals.append(time.monotonic() - start)
            data += chunk
    assert len(arrivals) >= 2 and arrivals[0] < arrivals[-1]
    audio, rate = sf.read(io.BytesIO(data))  # a streamed wav: unknown-length header, still readable
    assert rate == RATE and len(audio) == (len(data) - 44) // 2


def test_a_client_that_goes_away_cancels_its_job(stack, monkeypatch):
    jobs = []
    submit = stack.pool.submit
    monkeypatch.setattr(stack.pool, "submit", lambda *a, **kw: jobs.append(submit(*a, **kw)) or jobs[-1])
    body = {"model": "m", "voice": stack.ref, "input": LONG, "response_format": "pcm", "seed": 3}  # 7 chunks
    with httpx.stream("POST", f"{stack.url}/v1/audio/speech", json=body, timeout=60) as r:
        assert r.status_code == 200
        next(r.iter_bytes())
    deadline = time.monotonic() + 60
    while stack.pool.stats()["busy"]:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    left = []  # what the worker sent after nobody read any more: at most the chunk in progress, then "done"
    while not jobs[0].out.empty():
        left.append(jobs[0].out.get()[0])
    assert left[-1] == "done" and left.count("chunk") <= 2, left


def test_openai_sse_events(stack):
    deltas, done = [], None
    with stack.client.audio.speech.with_streaming_response.create(
            model="tts-1", voice=stack.ref, input=SHORT, response_format="pcm", stream_format="sse",
            speed=4.0, extra_body={"seed": 7}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["x-cosy-speed"] == "2"  # clamped to what the engine does
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "speech.audio.delta":
                deltas.append(base64.b64decode(event["audio"]))
            else:
                assert event["type"] == "speech.audio.done" and done is None
                done = event
    assert deltas and done is not None
    usage = done["usage"]
    assert usage["input_tokens"] == len(SHORT) and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert len(b"".join(deltas)) % 2 == 0


def test_openai_errors_come_back_as_openai_errors(stack):
    with pytest.raises(openai.NotFoundError, match="unknown reference audio"):
        stack.client.audio.speech.create(model="tts-1", voice="alloy", input=SHORT)
    with pytest.raises(openai.BadRequestError, match="speed"):
        stack.client.audio.speech.create(model="tts-1", voice=stack.ref, input=SHORT, speed=10)
    with pytest.raises(openai.BadRequestError, match="response_format"):
        stack.client.audio.speech.create(model="tts-1", voice=stack.ref, input=SHORT, response_format="m4a")
    r = httpx.post(f"{stack.url}/v1/audio/speech", content=b"{not json", headers={"content-type": "application/json"})
    _error(r, 400, "invalid_request_error", "not valid JSON")


# --- PAI-compatible ------------------------------------------------------------------------------------------

def _pai(stack, **kw):
    body = {"model": "CosyVoice2-0.5B", "input": {"mode": "fast_replication", "text": SHORT,
                                                  "reference_audio_id": stack.ref}, "seed": 5, **kw}
    return httpx.post(f"{stack.url}/api/v1/audio/speech", json=body, timeout=120)


def test_pai_streaming_sse_line_by_line(stack):
    events = []
    body = {"input": {"mode": "fast_replication", "text": MEDIUM, "reference_audio_id": stack.ref},
            "output_format": "mp3", "debug": True, "seed": 5}
    with httpx.stream("POST", f"{stack.url}/api/v1/audio/speech/", json=body, timeout=120) as r:  # trailing /
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
    assert len(events) >= 2
    assert all(e["output"]["finish_reason"] is None for e in events[:-1])
    assert events[-1]["output"]["finish_reason"] == "stop"
    assert len({e["request_id"] for e in events}) == 1
    m = [e["metrics"] for e in events]
    assert m[0]["server_cost_time"] > 0 and m[0]["generate_time"] > 0
    assert [x["server_cost_time"] for x in m] == sorted(x["server_cost_time"] for x in m)
    seconds = sum(x["speech_len"] for x in m)
    mp3 = b"".join(base64.b64decode(e["output"]["audio"]["data"]) for e in events)
    n, rate = _decode("mp3", mp3)
    assert abs(n / rate - seconds) < 0.15


def test_pai_non_streaming_rate_volume_and_modes(stack):
    def wav(**kw) -> tuple[np.ndarray, int]:
        r = _pai(stack, stream=False, output_format="wav", **kw)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["output"]["finish_reason"] == "stop" and out["request_id"]
        return sf.read(io.BytesIO(base64.b64decode(out["output"]["audio"]["data"])), dtype="int16")

    full, rate = wav()
    assert rate == RATE
    low, low_rate = wav(sample_rate=16000)
    assert low_rate == 16000 and len(low) == -(-len(full) * 2 // 3)
    half, _ = wav(volume=0.5)
    assert np.abs(half.astype(int) - np.round(full / 2)).max() <= 1  # same seed, same audio, half as loud
    sizes = {}
    for bit_rate in (32000, 128000):
        r = _pai(stack, stream=False, output_format="mp3", bit_rate=bit_rate)
        mp3 = base64.b64decode(r.json()["output"]["audio"]["data"])
        n, _ = _decode("mp3", mp3)
        assert abs(n - len(full)) <= 0.15 * RATE
        sizes[bit_rate] = len(mp3)
    assert sizes[128000] > 2.5 * sizes[32000]
    for mode, extra in (("cross_lingual_replication", {}), ("natural_language_replication", {"instruct": "慢慢说"})):
        r = _pai(stack, stream=False, output_format="pcm", debug=True,
                 input={"mode": mode, "text": SHORT, "reference_audio_id": stack.ref, **extra})
        assert r.status_code == 200, r.text
        assert len(base64.b64decode(r.json()["output"]["audio"]["data"])) > 0
        assert r.json()["metrics"]["speech_len"] > 0


def test_reference_audio_create_list_get_delete(stack):
    url = f"{stack.url}/api/v1/audio/reference_audio"
    made = []
    for name in ("a.wav", "b.flac"):
        data = ZS_WAV.read_bytes()
        if name.endswith(".flac"):
            buf = io.BytesIO()
            sf.write(buf, *sf.read(ZS_WAV), format="FLAC")
            data = buf.getvalue()
        r = httpx.post(url, files={"file": (name, data)}, data={"text": ZS_TEXT}, timeout=60)
        assert r.status_code == 200, r.text
        obj = r.json()
        assert obj["id"].startswith("ref_") and len(obj["id"]) == 16 and obj["filename"] == name
        assert obj["bytes"] == len(data) and obj["text"] == ZS_TEXT and isinstance(obj["created_at"], int)
        made.append(obj)
        time.sleep(1.1)  # distinct created_at seconds
    listed = httpx.get(url, params={"limit": 2}).json()
    assert [o["id"] for o in listed] == [made[1]["id"], made[0]["id"]]  # newest first
    oldest = httpx.get(url + "/", params={"order": "asc", "limit": 1}).json()
    assert oldest[0]["id"] == stack.ref
    assert httpx.get(f"{url}/{made[0]['id']}").json() == made[0]
    r = httpx.delete(f"{url}/{made[0]['id']}")
    assert r.status_code == 200 and r.json()["code"] == "OK" and r.json()["data"] == {}
    _error(httpx.get(f"{url}/{made[0]['id']}"), 404, "not_found", made[0]["id"])
    _error(httpx.delete(f"{url}/{made[0]['id']}"), 404, "not_found")
    _error(httpx.get(url, params={"order": "sideways"}), 400, "invalid_request_error", "order")
    _error(httpx.get(url, params={"limit": 0}), 400, "invalid_request_error", "limit")
    httpx.delete(f"{url}/{made[1]['id']}")


def test_voice_saved_elsewhere_is_a_reference_audio_in_every_mode(stack):
    stack.service.save_voice("webui-voice", ZS_TEXT, str(ZS_WAV))
    try:
        obj = httpx.get(f"{stack.url}/api/v1/audio/reference_audio/webui-voice").json()
        assert obj["filename"] is None and obj["text"] == ZS_TEXT
        audio = stack.client.audio.speech.create(model="m", voice="webui-voice", input=SHORT, response_format="pcm")
        assert len(audio.content) > 0
        for mode, extra in (("cross_lingual_replication", {}), ("natural_language_replication",
                                                                 {"instruct": "用开心的语气说"})):
            r = _pai(stack, input={"mode": mode, "text": SHORT, "reference_audio_id": "webui-voice", **extra},
                     stream=False)  # stored features serve every mode: no audio needed
            assert r.status_code == 200 and r.json()["output"]["audio"]["data"], r.text
    finally:
        stack.service.delete_voice("webui-voice")


def test_bad_input_is_refused_clearly_and_leaves_nothing_behind(stack):
    before = _tree(stack.data.root)
    url = f"{stack.url}/api/v1/audio/reference_audio"
    inp = {"text": SHORT, "reference_audio_id": stack.ref}
    _error(_pai(stack, input={**inp, "mode": "singing"}), 400, "invalid_request_error", "input.mode")
    _error(_pai(stack, input={"mode": "fast_replication", "reference_audio_id": stack.ref}), 400,
           "invalid_request_error", "input.text")
    _error(_pai(stack, input={**inp, "mode": "natural_language_replication"}), 400, "invalid_request_error",
           "input.instruct")
    _error(_pai(stack, input={**inp, "mode": "fast_replication", "reference_audio_id": "ref_000000000000"}), 404,
           "not_found", "ref_000000000000")
    _error(_pai(stack, input={**inp, "mode": "cross_lingual_replication", "reference_audio_id": "../../etc"}), 400,
           "invalid_request_error", "invalid reference audio id")
    _error(_pai(stack, speed=10), 400, "invalid_request_error", "speed")
    _error(_pai(stack, output_format="ogg"), 400, "invalid_request_error", "output_format")
    _error(_pai(stack, output_format="opus", sample_rate=22050), 400, "invalid_request_error", "opus", "22050")
    big = b"\0" * (21 * 2**20)
    _error(httpx.post(url, files={"file": ("big.wav", big)}, data={"text": ZS_TEXT}, timeout=60), 413,
           "invalid_request_error", "limit is 20 MB")
    _error(httpx.post(url, files={"file": ("x.wav", b"this is not audio at all " * 400)}, data={"text": ZS_TEXT}),
           400, "invalid_request_error", "not audio")
    _error(httpx.post(url, files={"file": ("x.txt", ZS_WAV.read_bytes())}, data={"text": ZS_TEXT}), 415,
           "invalid_request_error", "unsupported upload")
    _error(httpx.post(url, files={"file": ("x.wav", ZS_WAV.read_bytes())}), 400, "invalid_request_error", "'text'")
    _error(httpx.post(url, data={"text": ZS_TEXT}), 400, "invalid_request_error", "'file'")
    short = io.BytesIO()
    sf.write(short, np.zeros(RATE // 10, np.float32) + 0.1, RATE, format="WAV")  # decodes, but 0.1 s: too short
    _error(httpx.post(url, files={"file": ("../../short.wav", short.getvalue())}, data={"text": ZS_TEXT},
                      timeout=60), 400, "invalid_request_error", "the reference audio is 0.10 s")
    _error(httpx.get(f"{url}/%2e%2e"), 400, "invalid_request_error", "invalid reference audio id")
    _error(httpx.delete(f"{url}/..%2F..%2Fvoices"), 404, "not_found")
    _error(httpx.get(f"{url}/.hidden"), 400, "invalid_request_error")
    assert _tree(stack.data.root) == before


# --- routing, auth, ops --------------------------------------------------------------------------------------

def test_unknown_paths_list_the_api_and_gradio_still_works(stack):
    err = _error(httpx.get(f"{stack.url}/v2/nothing"), 404, "not_found", "/v2/nothing")
    assert "POST /v1/audio/speech" in err["routes"] and "GET /api/v1/audio/reference_audio/{reference_audio_id}" \
        in err["routes"]
    _error(httpx.post(f"{stack.url}/api/v1/audio/tts", json={}), 404, "not_found")
    r = httpx.get(f"{stack.keyed}/nope", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 404 and "routes" in r.json()["error"]
    r = httpx.get(f"{stack.url}/v1/audio/speech")
    _error(r, 405, "invalid_request_error", "POST")
    assert r.headers["allow"] == "POST"
    for base in (stack.url, stack.keyed):
        page = httpx.get(f"{base}/")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert httpx.get(f"{base}/config").status_code == 200
        assert httpx.get(f"{base}/gradio_api/info").status_code == 200
        missing = httpx.get(f"{base}/assets/no-such-file.js")  # Gradio's own 404, left alone
        assert missing.status_code == 404 and "error" not in missing.text


def test_api_key(stack):
    url = f"{stack.keyed}/api/v1/audio/reference_audio"
    _error(httpx.get(url), 401, "unauthorized", "Authorization: Bearer")
    r = httpx.get(url, headers={"Authorization": "Bearer wrong"})
    _error(r, 401, "unauthorized", "wrong API key")
    assert r.headers["www-authenticate"] == "Bearer"
    assert httpx.get(url, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert httpx.get(url, headers={"Authorization": KEY}).status_code == 200  # PAI-EAS style: the bare token
    _error(httpx.get(f"{stack.keyed}/metrics"), 401, "unauthorized")
    assert httpx.get(f"{stack.keyed}/health").json() == {"status": "ok"}
    assert httpx.get(f"{stack.keyed}/ready").status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{stack.keyed}/v1", api_key="wrong", max_retries=0).audio.speech.create(
            model="m", voice=stack.ref, input=SHORT)
    audio = openai.OpenAI(base_url=f"{stack.keyed}/v1", api_key=KEY, max_retries=0).audio.speech.create(
        model="m", voice=stack.ref, input=SHORT, response_format="wav")
    assert sf.info(io.BytesIO(audio.content)).samplerate == RATE
    assert httpx.get(f"{stack.url}/api/v1/audio/reference_audio").status_code == 200  # no key: open


def test_full_queue_answers_429_with_retry_after(stack):
    limit = stack.pool.max_queue
    stack.pool.max_queue = 0  # every job would have to wait: the queue is full
    try:
        with pytest.raises(openai.RateLimitError) as e:
            stack.client.audio.speech.create(model="m", voice=stack.ref, input=SHORT)
        assert int(e.value.response.headers["retry-after"]) >= 1
        r = _pai(stack)
        _error(r, 429, "rate_limited", "busy")
        assert int(r.headers["retry-after"]) >= 1
        r = httpx.post(f"{stack.url}/api/v1/audio/reference_audio", files={"file": ("p.wav", ZS_WAV.read_bytes())},
                       data={"text": ZS_TEXT})
        _error(r, 429, "rate_limited")
    finally:
        stack.pool.max_queue = limit


def test_health_ready_metrics(stack):
    assert httpx.get(f"{stack.url}/health").json() == {"status": "ok"}
    assert httpx.get(f"{stack.url}/ready").json()["status"] == "ready"
    stack.state["ready"] = (False, "cannot reach the LM backend at http://lm:8000/v1")
    try:
        r = httpx.get(f"{stack.url}/ready")
        _error(r, 503, "unavailable", "cannot reach the LM backend")
        assert r.headers["retry-after"]
    finally:
        stack.state["ready"] = (True, "ok")
    stack.client.audio.speech.create(model="m", voice=stack.ref, input=SHORT, response_format="pcm")
    r = httpx.get(f"{stack.url}/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert 'cosy_http_requests_total{method="POST",route="/v1/audio/speech",status="200"}' in text
    assert 'cosy_http_errors_total{route="unmatched",type="not_found"}' in text or "cosy_http_errors_total" in text
    for name in ("cosy_first_packet_seconds_bucket", "cosy_rtf_bucket", "cosy_queue_waiting", "cosy_workers_busy",
                 "cosy_ready_check_seconds_count", "cosy_audio_seconds_total"):
        assert name in text, name


# --- pieces --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("new", [8000, 16000, 22050, 44100, 48000])
def test_stream_resampler_equals_resampling_the_whole_signal(new):
    x = (np.random.default_rng(0).standard_normal(30000) * 0.1).astype(np.float32)
    r = StreamResampler(RATE, new)
    parts, i = [], 0
    for size in (5, 4000, 1, 11000, 14994):
        parts.append(r.push(x[i:i + size]))
        i += size
    parts.append(r.finish())
    whole = resample(torch.from_numpy(x), RATE, new).numpy()
    assert np.allclose(np.concatenate(parts), whole, atol=1e-6)
