"""PAI-compatible routes over real HTTP (reference audio, speech with SSE), plus what every API shares: bad
input leaving nothing behind, 404 beside a mounted Gradio, auth, 429 with Retry-After, /health /ready /metrics."""
from __future__ import annotations

import base64
import io
import json
import time

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from http_stack import KEY, MEDIUM, RATE, SHORT, ZS_TEXT, ZS_WAV, _decode, _error, _pai, _tree


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
