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
