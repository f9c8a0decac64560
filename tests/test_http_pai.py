"""PAI-compatible routes over real HTTP (reference audio, speech with SSE), plus what every API shares: bad
input leaving nothing behind, 404 beside a mounted Gradio, auth, 429 with Retry-After, /health /ready /metrics."""
from __future__ import annotations

import base64
import io
import json
import time
import uuid

import av
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


# --- the published layout (PAI-API.md): options inside `input`, answers with `error` (and `metrics`) ---------

PUBLISHED_MODES = (("fast_replication", {}), ("cross_lingual_replication", {}),
                   ("natural_language_replication", {"instruct": "用四川话说这句话"}))


def _published(stack, mode="fast_replication", stream=True, text=SHORT, **options) -> dict:
    """A request as the published examples write it: only model, input and stream at the top level."""
    extra = dict(PUBLISHED_MODES)[mode]
    return {"model": "CosyVoice2-0.5B", "stream": stream,
            "input": {"mode": mode, "text": text, "reference_audio_id": stack.ref, **extra, **options}}


def _speak(stack, body: dict) -> tuple[bytes, list[dict]]:
    """(the audio file, the answers): one JSON answer, or every SSE event, as the published clients read them."""
    url = f"{stack.url}/api/v1/audio/speech"
    if not body.get("stream", True):
        r = httpx.post(url, json=body, timeout=120)
        assert r.status_code == 200, r.text
        events = [r.json()]
    else:
        events = []
        with httpx.stream("POST", url, json=body, timeout=120) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
    for e in events:  # what the published streaming client reads from every event
        assert e["error"] is None, e
        assert e["request_id"] == events[0]["request_id"]
        assert set(e["output"]) == {"finish_reason", "audio"} and e["output"]["audio"]["data"]
    assert [e["output"]["finish_reason"] for e in events] == [None] * (len(events) - 1) + ["stop"]
    return b"".join(base64.b64decode(e["output"]["audio"]["data"]) for e in events), events


def _av_decode(data: bytes) -> tuple[np.ndarray, int, str]:
    """(float samples, rate, container format as probed from the bytes) by ffmpeg's decoders."""
    with av.open(io.BytesIO(data)) as c:
        codec = c.format.name
        frames = list(c.decode(audio=0))
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]), frames[0].sample_rate, codec


@pytest.mark.parametrize("stream", [False, True], ids=["http", "sse"])
def test_published_example_requests_in_every_mode(stack, stream):
    for mode, _ in PUBLISHED_MODES:
        body = _published(stack, mode, stream, output_format="mp3", sample_rate=32000, bit_rate="48k",
                          volume=1.0, speed=1.0, debug=True, seed=5)
        mp3, events = _speak(stack, body)
        audio, rate, codec = _av_decode(mp3)
        assert (codec, rate) == ("mp3", 32000) and len(audio) > rate // 4, (mode, codec, rate)
        for e in events:
            m = e["metrics"]
            assert m["speech_len"] > 0 and m["server_cost_time"] > 0 and m["generate_time"] >= 0, (mode, m)
        assert abs(sum(e["metrics"]["speech_len"] for e in events) - len(audio) / rate) < 0.15
        assert events[-1]["usage"] == {"characters": len(SHORT)}
        if stream:
            assert len(events) >= 2
    # without debug: no metrics, still `error` in every event (checked by _speak); defaults: wav at 24 kHz
    wav, events = _speak(stack, _published(stack, stream=stream, seed=5))
    assert all("metrics" not in e for e in events)
    info = sf.info(io.BytesIO(wav))
    assert (info.format, info.samplerate) == ("WAV", RATE)


def test_published_volume_speed_rate_and_format_are_applied(stack):
    def pcm(**options) -> np.ndarray:
        data, _ = _speak(stack, _published(stack, stream=False, text=MEDIUM, output_format="pcm", seed=11, **options))
        return np.frombuffer(data, "<i2").astype(np.float64)

    base, loud, fast = pcm(), pcm(volume=2.0), pcm(speed=1.2)
    assert len(loud) == len(base)
    unclipped = np.abs(loud) < 32000
    ratio = np.sqrt(np.mean(loud[unclipped] ** 2) / np.mean(base[unclipped] ** 2))
    assert 1.95 < ratio < 2.05, ratio  # same seed: the same audio, twice as loud where not clipped
    assert 0.8 < len(fast) / len(base) < 0.87, len(fast) / len(base)  # ~1 / 1.2
    # the example: mp3 at 32000 Hz, volume 2.0, speed 1.2, streamed
    mp3, events = _speak(stack, _published(stack, text=MEDIUM, output_format="mp3", sample_rate=32000,
                                           bit_rate="64k", volume=2.0, speed=1.2, debug=True, seed=11))
    audio, rate, codec = _av_decode(mp3)
    assert (codec, rate) == ("mp3", 32000)
    assert abs(len(audio) / rate - len(fast) / RATE) < 0.15  # speed 1.2
    assert np.sqrt(np.mean(audio ** 2)) > 1.6 * np.sqrt(np.mean((base / 32768) ** 2))  # volume 2 (mp3: roughly)
    assert all(e["metrics"]["speech_len"] > 0 for e in events)
    # published bit rates are strings; the file size follows them
    sizes = {}
    for bit_rate in ("32k", "128k"):
        data, _ = _speak(stack, _published(stack, stream=False, output_format="mp3", bit_rate=bit_rate, seed=5))
        sizes[bit_rate] = len(data)
    assert sizes["128k"] > 2.5 * sizes["32k"]
    # every published bit rate works at every example rate, capped where the codec can do less (documented)
    for fmt in ("mp3", "opus", "aac"):
        data, _ = _speak(stack, _published(stack, stream=False, output_format=fmt, sample_rate=24000,
                                           bit_rate="384k", seed=5))
        assert _av_decode(data)[1] in (24000, 48000), fmt  # ffmpeg decodes opus at 48 kHz


def test_published_and_top_level_layouts_together(stack):
    top, _ = _speak(stack, {"model": "CosyVoice2-0.5B", "stream": False, "output_format": "pcm", "seed": 5,
                            "input": {"mode": "fast_replication", "text": SHORT, "reference_audio_id": stack.ref}})
    inside, _ = _speak(stack, _published(stack, stream=False, output_format="pcm", seed=5))
    assert top == inside  # our earlier top-level layout still works, and means the same
    same = _published(stack, stream=False, output_format="pcm", seed=5)
    same.update(output_format="pcm", seed=5)  # the same value in both places is fine
    assert _speak(stack, same)[0] == inside
    for field, inner, outer in (("speed", 1.2, 1.0), ("output_format", "mp3", "wav"), ("bit_rate", "48k", 64000),
                                ("sample_rate", 32000, 24000), ("debug", True, False)):
        body = _published(stack, **{field: inner})
        body[field] = outer
        _error(httpx.post(f"{stack.url}/api/v1/audio/speech", json=body, timeout=60), 400,
               "invalid_request_error", field, "given twice")
    assert _speak(stack, {**_published(stack, stream=False, output_format="pcm", seed=5, bit_rate="48k"),
                          "bit_rate": 48000})[0] == inside  # "48k" == 48000 bit/s: no conflict


def test_published_bad_values_are_refused_naming_the_field(stack):
    url = f"{stack.url}/api/v1/audio/speech"
    for field, value, words in (("bit_rate", "24k", ("input.bit_rate", "16k, 32k", "384k")),
                                ("bit_rate", "fast", ("input.bit_rate", "192k")),
                                ("bit_rate", 1000000, ("input.bit_rate", "384000")),
                                ("speed", 2.5, ("input.speed", "2")), ("speed", 0.4, ("input.speed", "0.5")),
                                ("volume", -1, ("input.volume", "0")),
                                ("sample_rate", 4000, ("input.sample_rate", "8000")),
                                ("output_format", "ogg", ("input.output_format", "'mp3'", "'pcm'")),
                                ("debug", "maybe", ("input.debug",))):
        _error(httpx.post(url, json=_published(stack, **{field: value}), timeout=60), 400, "invalid_request_error",
               *words)
    _error(httpx.post(url, json={**_published(stack), "bit_rate": "24k"}, timeout=60), 400,
           "invalid_request_error", "bit_rate", "192k")


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
        assert str(uuid.UUID(obj["id"])) == obj["id"] and obj["filename"] == name  # a UUID, as published
        assert obj["bytes"] == len(data) and obj["text"] == ZS_TEXT and isinstance(obj["created_at"], int)
        made.append(obj)
        time.sleep(1.1)  # distinct created_at seconds
    listed = httpx.get(url, params={"limit": 2}).json()
    assert [o["id"] for o in listed] == [made[1]["id"], made[0]["id"]]  # newest first
    oldest = httpx.get(url + "/", params={"order": "asc", "limit": 1}).json()
    assert oldest[0]["id"] == stack.ref
    assert httpx.get(f"{url}/{made[0]['id']}").json() == made[0]
    r = httpx.delete(f"{url}/{made[0]['id']}")
    assert r.status_code == 200
    assert r.json() == {"code": "OK", "message": f"reference audio: {made[0]['id']} deleted.", "data": {}}
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
    for base, headers in ((stack.url, {}), (stack.keyed, {"Authorization": f"Bearer {KEY}"})):
        page = httpx.get(f"{base}/", headers=headers)
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert httpx.get(f"{base}/config", headers=headers).status_code == 200
        assert httpx.get(f"{base}/gradio_api/info", headers=headers).status_code == 200
        missing = httpx.get(f"{base}/assets/no-such-file.js", headers=headers)  # Gradio's own 404, left alone
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
        _error(r, 503, "unavailable", "not ready")
        assert "lm:8000" not in r.text and "backend" not in r.text  # the reason goes to the log only
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


@pytest.mark.quick
def test_each_option_is_read_inside_input_and_at_the_top_level():
    """cosy.frontend.pai_api.resolve_options, field by field: published inside `input`, still accepted at the
    top level, the default when absent (one field once read only at the top level lost the published form)."""
    from cosy.frontend.pai_api import OPTION_DEFAULTS, PaiSpeech, parse_bit_rate, resolve_options
    given = {"sample_rate": 16000, "bit_rate": "64k", "volume": 0.5, "speed": 1.5, "output_format": "mp3",
             "debug": True, "seed": 7, "enable_ssml": True, "priority": "bulk",
             "hot_fix": {"replace": [{"WHO": "世界卫生组织"}]}, "sentence_timestamp_enabled": True,
             "word_timestamp_enabled": True, "language_hints": ["de"], "enable_markdown_filter": True}
    assert given.keys() == OPTION_DEFAULTS.keys()  # a new option is added here too
    base = {"mode": "fast_replication", "text": "你好。", "reference_audio_id": "r"}
    for name, value in given.items():
        want = parse_bit_rate(value) if name == "bit_rate" else value
        inside = resolve_options(PaiSpeech.model_validate({"input": {**base, name: value}}))
        top = resolve_options(PaiSpeech.model_validate({name: value, "input": base}))
        default = resolve_options(PaiSpeech.model_validate({"input": base}))[name]
        assert inside[name] == top[name] == want != default, (name, inside[name], top[name], default)
