"""OpenAI-compatible /v1/audio/speech over real HTTP with the official client: every output format checked
with an independent decoder, streaming, SSE, errors, cancellation; and the streaming resampler."""
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
import torch
from http_stack import LONG, MEDIUM, RATE, SHORT, _decode, _error, wait_idle

from cosy.audio.resample import resample
from cosy.frontend.audio_out import StreamResampler


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
    wait_idle(stack.pool, 60)
    # what was relayed but never read: at most the chunk in progress (once the job is cancelled the
    # dispatcher relays nothing more, not even its "done"), and the job was cancelled, not failed
    left = []
    while not jobs[0].out.empty():
        left.append(jobs[0].out.get()[0])
    assert jobs[0].cancelled.is_set() and left.count("chunk") <= 2 and "error" not in left, left


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


# --- /v1/audio/voices and /v1/audio/speech/batch (issue 58; docs/api/voices.md) ----------------------------


def _frontend(stack, model_dir=None, full: bool = False):
    """Another frontend on the stack's data dir (its own DataDir and FrontendService; the stack's workers, or
    for `model_dir` a pool of that model that is never started: what it is asked is answered before any work).
    `full`: the real app (WebUI and gradio_client API, `build_app`). Returns (url, server, thread)."""
    from http_stack import _app, _serve

    from cosy.deploy.data_dir import DataDir
    from cosy.frontend.http_api import install
    from cosy.frontend.server import build_app
    from cosy.frontend.service import FrontendService
    from cosy.service.workers import EngineSpec, WorkerPool

    pool = stack.pool if model_dir is None else WorkerPool(EngineSpec(str(model_dir)), workers=1)
    service = FrontendService(pool, DataDir(stack.data.root))
    ready = lambda: (True, "ok")  # noqa: E731
    app = (build_app(service, 1, 8, extensions=[lambda a: install(a, service, api_key=None, ready=ready)])
           if full else _app(service, None, ready))
    server, thread, url = _serve(app)
    return url, server, thread


def _stop(server, thread) -> None:
    server.should_exit = True
    thread.join(10)


def _create(url: str, name: str, wav: bytes, *, consent: str | None = "rec-0001", headers=None, **fields):
    from http_stack import ZS_TEXT
    data = {"name": name, "ref_text": ZS_TEXT, **fields}
    if consent is not None:
        data["consent"] = consent
    return httpx.post(f"{url}/v1/audio/voices", files={"audio_sample": ("prompt.wav", wav, "audio/wav")},
                      data={k: v for k, v in data.items() if v is not None}, headers=headers, timeout=120)


def _wav(audio: np.ndarray, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, rate, format="WAV", subtype="FLOAT")
    return buf.getvalue()


def test_a_voice_made_over_the_api_serves_every_surface_of_a_second_frontend(stack):
    from gradio_client import Client, handle_file
    from http_stack import KEY, ZS_TEXT, ZS_WAV

    # plain HTTP on the open frontend, the openai client on the keyed one
    r = _create(stack.url, "alice", ZS_WAV.read_bytes())
    assert r.status_code == 200, r.text
    v = r.json()["voice"]
    assert r.json()["success"] is True and v["name"] == "alice" and v["ref_text"] == ZS_TEXT
    assert v["family"] == "cosyvoice2" and v["consent"] == "rec-0001" and v["created_by"] == "anonymous"
    assert 2.0 < v["prompt_seconds"] < 5.0 and v["file_size"] > 0 and v["created_at"] == v["updated_at"]
    assert v["preprocess"]["gain_db"] != 0
    keyed = openai.OpenAI(base_url=f"{stack.keyed}/v1", api_key=KEY, max_retries=0, timeout=120)
    made = keyed.post("/audio/voices", cast_to=object, body={"name": "bob", "consent": "c-2", "ref_text": ZS_TEXT},
                      files=[("audio_sample", ("p.wav", ZS_WAV.read_bytes(), "audio/wav"))],
                      options={"headers": {"Content-Type": "multipart/form-data"}})
    assert made["voice"]["created_by"] == "api_key" and KEY not in json.dumps(made)
    listed = keyed.get("/audio/voices", cast_to=object)
    assert {"alice", "bob", stack.ref} <= set(listed["voices"])

    url2, server, thread = _frontend(stack, full=True)
    try:
        other = openai.OpenAI(base_url=f"{url2}/v1", api_key="x", max_retries=0, timeout=120)
        wav = other.audio.speech.create(model="m", voice="alice", input=SHORT, response_format="wav").content
        assert _decode("wav", wav)[0] > RATE // 4
        gradio = Client(url2, verbose=False)
        assert "alice" in {x["voice_id"] for x in gradio.predict(api_name="/list_voices")}
        assert sf.info(gradio.predict(SHORT, "alice", 1, 1.0, api_name="/saved_voice")).frames > 0
        pai = httpx.get(f"{url2}/api/v1/audio/reference_audio/alice", timeout=30)
        assert pai.status_code == 200 and pai.json()["text"] == ZS_TEXT
        speech = httpx.post(f"{url2}/api/v1/audio/speech", timeout=120, json={
            "model": "CosyVoice2-0.5B", "input": {"mode": "fast_replication", "text": SHORT,
                                                  "reference_audio_id": "alice"}})
        assert speech.status_code == 200, speech.text
        # the other way round: a voice saved in gradio is managed here
        gradio.predict("from-gradio", ZS_TEXT, handle_file(ZS_WAV), api_name="/save_voice")
        got = httpx.get(f"{stack.url}/v1/audio/voices/from-gradio", timeout=30).json()
        assert got["ref_text"] == ZS_TEXT and got["created_by"] is None and got["prompt_seconds"] > 2.0
        # rename, new transcript; the second frontend speaks with the new name at once
        r = httpx.patch(f"{stack.url}/v1/audio/voices/alice", data={"name": "alice-2"}, timeout=30)
        assert r.status_code == 200 and r.json()["voice"]["name"] == "alice-2", r.text
        assert r.json()["voice"]["consent"] == "rec-0001" and r.json()["voice"]["created_by"] == "anonymous"
        _error(httpx.get(f"{stack.url}/v1/audio/voices/alice", timeout=30), 404, "not_found", "alice")
        wav = other.audio.speech.create(model="m", voice="alice-2", input=SHORT, response_format="wav").content
        assert _decode("wav", wav)[0] > RATE // 4
        new_text = "希望你以后能够做得比我还好哟。"
        r = httpx.patch(f"{url2}/v1/audio/voices/alice-2", data={"ref_text": new_text}, timeout=30)
        assert r.json()["voice"]["ref_text"] == new_text
        _error(httpx.patch(f"{stack.url}/v1/audio/voices/alice-2", data={"name": "bob"}, timeout=30), 409,
               "invalid_request_error", "exists")
        _error(httpx.patch(f"{stack.url}/v1/audio/voices/alice-2", data={}, timeout=30), 400,
               "invalid_request_error", "nothing to update")
        # delete on one frontend: gone on the other, on every surface
        assert httpx.delete(f"{stack.url}/v1/audio/voices/alice-2", timeout=30).json() == {"success": True,
                                                                                           "name": "alice-2"}
        _error(httpx.delete(f"{url2}/v1/audio/voices/alice-2", timeout=30), 404, "not_found")
        with pytest.raises(openai.NotFoundError):
            other.audio.speech.create(model="m", voice="alice-2", input=SHORT)
        assert "alice-2" not in {x["voice_id"] for x in gradio.predict(api_name="/list_voices")}
    finally:
        _stop(server, thread)
        for name in ("bob", "from-gradio"):
            httpx.delete(f"{stack.url}/v1/audio/voices/{name}", timeout=30)


def test_bad_voice_uploads_name_the_field(stack):
    from http_stack import ZS_WAV
    wav = ZS_WAV.read_bytes()
    _error(_create(stack.url, "c1", wav, consent=None), 400, "invalid_request_error", "'consent' is required")
    _error(_create(stack.url, "c1", wav, ref_text=""), 400, "invalid_request_error", "'ref_text' is required")
    for bad in ("-dash", "a/b", "x" * 65, "a..b"):
        _error(_create(stack.url, bad, wav), 400, "invalid_request_error", "'name'")
    _error(_create(stack.url, "", wav), 400, "invalid_request_error", "'name' is required")
    fields = {"name": "c1", "consent": "c", "ref_text": "你好。"}
    r = httpx.post(f"{stack.url}/v1/audio/voices", data=fields, timeout=30)
    _error(r, 400, "invalid_request_error", "'audio_sample' is required")
    r = httpx.post(f"{stack.url}/v1/audio/voices", files={"audio_sample": ("notes.txt", b"hello", "text/plain")},
                   data={"name": "c1", "consent": "c", "ref_text": "你好。"}, timeout=30)
    _error(r, 415, "invalid_request_error", "notes.txt")
    r = httpx.post(f"{stack.url}/v1/audio/voices", files={"audio_sample": ("x.wav", b"RIFF not audio" * 50)},
                   data={"name": "c1", "consent": "c", "ref_text": "你好。"}, timeout=30)
    _error(r, 400, "invalid_request_error", "not audio")
    limit = stack.data.max_upload_bytes
    stack.data.max_upload_bytes = 1000
    try:
        _error(_create(stack.url, "c1", wav), 413, "invalid_request_error", "larger than the limit")
    finally:
        stack.data.max_upload_bytes = limit
    t = np.arange(3 * 16000) / 16000
    tone = (np.sin(2 * np.pi * 150 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 4 * t))).astype(np.float32)
    _error(_create(stack.url, "c1", _wav(np.clip(3 * tone, -1, 1))), 400, "invalid_request_error", "clipped")
    _error(_create(stack.url, "c1", _wav(0.002 * tone)), 400, "invalid_request_error", "near-silent")
    _error(_create(stack.url, "c1", wav, too_long="cut"), 400, "invalid_request_error", "'too_long'")
    _error(_create(stack.url, stack.ref, wav), 409, "invalid_request_error", "exists already")
    assert "c1" not in httpx.get(f"{stack.url}/v1/audio/voices", timeout=30).json()["voices"]  # nothing left


def test_without_hygiene_a_voice_is_stored_exactly_as_the_pai_route_stores_it(stack):
    from http_stack import ZS_WAV
    audio, rate = sf.read(ZS_WAV, dtype="float32")
    padded = np.concatenate([np.zeros(rate, np.float32), audio, np.zeros(rate, np.float32)])
    for name, wav, preprocess in (("raw", ZS_WAV.read_bytes(), "false"), ("clean", ZS_WAV.read_bytes(), "true"),
                                  ("padded-raw", _wav(padded, rate), "false"), ("padded", _wav(padded, rate), "true")):
        assert _create(stack.url, name, wav, preprocess=preprocess).status_code == 200, name
    try:
        store = stack.data.voices
        pai, raw, cleaned = store.load(stack.ref).features, store.load("raw").features, store.load("clean").features
        for key in ("speech_tokens", "mel", "embedding"):  # byte for byte what the PAI upload stored
            assert getattr(pai, key).numpy().tobytes() == getattr(raw, key).numpy().tobytes(), key
        assert cleaned.embedding.numpy().tobytes() != raw.embedding.numpy().tobytes()  # hygiene did something
        voices = {v["name"]: v for v in httpx.get(f"{stack.url}/v1/audio/voices", timeout=30).json()["uploaded_voices"]}
        assert voices["raw"]["preprocess"] is None and voices["padded"]["preprocess"]["trimmed_start"] > 0.8
        assert voices["padded-raw"]["prompt_seconds"] - voices["padded"]["prompt_seconds"] > 1.5  # silence trimmed
    finally:
        for name in ("raw", "clean", "padded-raw", "padded"):
            store.delete(name)


def test_the_caps_refuse_a_new_voice_on_every_surface(stack):
    from http_stack import ZS_TEXT, ZS_WAV

    from cosy.deploy.voices import VoiceLimits
    store = stack.data.voices
    count = len(store.list())
    store.limits = VoiceLimits(max_voices=count)
    try:
        _error(_create(stack.url, "one-more", ZS_WAV.read_bytes()), 409, "invalid_request_error", "--max_voices")
        r = httpx.post(f"{stack.url}/api/v1/audio/reference_audio", files={"file": ("p.wav", ZS_WAV.read_bytes())},
                       data={"text": ZS_TEXT}, timeout=60)
        _error(r, 409, "invalid_request_error", "--max_voices")
        # renaming one is not one more
        r = httpx.patch(f"{stack.url}/v1/audio/voices/{stack.ref}", data={"consent": "c"}, timeout=30)
        assert r.status_code == 200, r.text
        used = sum(store.size(v["voice_id"]) for v in store.list())
        store.limits = VoiceLimits(max_bytes=used + 100)
        _error(_create(stack.url, "one-more", ZS_WAV.read_bytes()), 409, "invalid_request_error", "--voices_max_mb")
    finally:
        store.limits = VoiceLimits()
    assert len(store.list()) == count


def test_batch_items_run_alone_good_and_bad(stack):
    items = [{"input": SHORT}, {"input": MEDIUM, "response_format": "mp3", "speed": 1.2}, {"voice": stack.ref},
             {"input": SHORT, "voice": "no-such-voice"}, "not an object", {"input": SHORT, "speed": 9}]
    from servers import metric

    def bulk_waits() -> float:
        text = httpx.get(f"{stack.url}/metrics", timeout=30).text
        return metric(text, "cosy_queue_wait_seconds_count", priority="bulk", api="openai")

    before = bulk_waits()
    r = httpx.post(f"{stack.url}/v1/audio/speech/batch", timeout=300,
                   json={"model": "m", "voice": stack.ref, "seed": 3, "priority": "bulk", "items": items})
    assert r.status_code == 200, r.text
    assert bulk_waits() == before + 2  # both good items were served in the batch's class
    body = r.json()
    assert (body["total"], body["succeeded"], body["failed"]) == (6, 2, 4) and body["object"] == "speech.batch"
    res = body["results"]
    assert [x["index"] for x in res] == list(range(6))
    assert res[0]["media_type"] == "audio/wav" and _decode("wav", base64.b64decode(res[0]["audio_data"]))[0] > 0
    assert res[1]["media_type"] == "audio/mpeg" and _decode("mp3", base64.b64decode(res[1]["audio_data"]))[0] > 0
    assert res[2]["code"] == 400 and "items[2]" in res[2]["error"] and "input" in res[2]["error"]
    assert res[3]["code"] == 404 and "no-such-voice" in res[3]["error"]
    assert res[4]["code"] == 400 and "items[4] must be an object" in res[4]["error"]
    assert res[5]["code"] == 400 and "speed" in res[5]["error"]
    # the same item in a batch of its own gives the same audio (seeded): running beside others changes nothing
    alone = httpx.post(f"{stack.url}/v1/audio/speech/batch", timeout=300,
                       json={"voice": stack.ref, "seed": 3, "items": [{"input": SHORT}]}).json()["results"][0]
    assert alone["audio_data"] == res[0]["audio_data"]
    too_many = {"voice": stack.ref, "items": [{"input": SHORT}] * 33}
    _error(httpx.post(f"{stack.url}/v1/audio/speech/batch", json=too_many, timeout=30), 400,
           "invalid_request_error", "items")
    _error(httpx.post(f"{stack.url}/v1/audio/speech/batch", json={"items": []}, timeout=30), 400,
           "invalid_request_error", "items")
    _error(httpx.post(f"{stack.url}/v1/audio/speech/batch", json={"items": [{"input": SHORT}], "priority": "urgent"},
                      timeout=30), 400, "invalid_request_error", "priority")


def test_a_voice_of_another_family_is_a_409_never_audio(stack, tiny_cv3_model_dir):
    url, server, thread = _frontend(stack, model_dir=tiny_cv3_model_dir)
    try:
        r = httpx.post(f"{url}/v1/audio/speech", json={"model": "m", "voice": stack.ref, "input": SHORT}, timeout=60)
        _error(r, 409, "invalid_request_error", "saved with a cosyvoice2 model and this model is cosyvoice3")
        r = httpx.post(f"{url}/v1/audio/speech/batch", json={"voice": stack.ref, "items": [{"input": SHORT}]},
                       timeout=60)
        assert r.json()["results"][0]["code"] == 409 and r.json()["results"][0]["audio_data"] is None
        listed = httpx.get(f"{url}/v1/audio/voices/{stack.ref}", timeout=30).json()
        assert listed["family"] == "cosyvoice2"
    finally:
        _stop(server, thread)
