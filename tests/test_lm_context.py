"""The LM's context on a real vLLM backend with the CPU default `max_model_len` (2048; the shared test backends
have 32768): a sentence that needs more speech tokens than the context holds is split to fit and spoken on
every surface, never sent to be refused; where no split exists it is refused up front (400); a backend's own
refusal is a 400 naming the limit, never a retry-advised 503. And a 19,000-digit text costs milliseconds of
normalization, not a minute, while a normal request beside it goes on.

The workers take `TAKE` speech tokens of each LM call (`worker_hooks.take_lm`) while the backend is asked for
the call's own max_len: the real requests, without the minutes of audio a random LM makes."""
from __future__ import annotations

import base64
import functools
import io
import json
import threading
import time
from types import SimpleNamespace

import httpx
import openai
import pytest
import soundfile as sf
from http_stack import SHORT, ZS_TEXT, ZS_WAV, _app, _decode, _serve
from servers import API_KEY, Backend, running_backend
from worker_hooks import take_lm

from cosy.deploy.data_dir import DataDir
from cosy.errors import CosyError
from cosy.frontend.server import readiness
from cosy.frontend.service import FrontendService
from cosy.service.workers import EngineSpec, WorkerPool

CONTEXT = 2048  # launch/backend.py's default on the CPU
COMMAS = "今天天气很好，" * 30  # one sentence of 120 text ids: up to 2400 speech tokens, more than CONTEXT
TAKE = 60  # more than a stream's first chunk (decoded apart), so that the rest of the utterance is asked for too
DIGITS = "1" * 19000


@pytest.fixture(scope="module")
def small_backend(tiny_model_dir, tmp_path_factory):
    folder = tmp_path_factory.mktemp("context")
    b = Backend(tiny_model_dir, folder / "cache", folder / "backend.log", max_model_len=CONTEXT)
    b.launch()
    with running_backend(tiny_model_dir, folder, b) as b:
        yield b


@pytest.fixture(scope="module")
def ctx(small_backend, tiny_model_dir, tmp_path_factory):
    spec = EngineSpec(str(tiny_model_dir), llm_base_url=small_backend.url, llm_api_key=API_KEY, max_batch=4)
    pool = WorkerPool(spec, workers=1, max_queue=8)
    pool.worker_prepare = functools.partial(take_lm, n=TAKE)
    pool.start()
    service = FrontendService(pool, DataDir(tmp_path_factory.mktemp("data")))
    readiness(service, small_backend.url, API_KEY)  # reads the backend's max_model_len, as app.py does
    assert service.lm_max_len == CONTEXT
    server, thread, url = _serve(_app(service, None, lambda: (True, "ok")))

    def upload(text: str) -> str:
        r = httpx.post(f"{url}/api/v1/audio/reference_audio", files={"file": ("p.wav", ZS_WAV.read_bytes())},
                       data={"text": text}, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()["id"]

    yield SimpleNamespace(url=url, pool=pool, upload=upload, ref=upload(ZS_TEXT),
                          client=openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300))
    server.should_exit = True
    thread.join(10)
    pool.close()


def _pai(ctx, text: str, ref: str | None = None, **kw) -> httpx.Response:
    body = {"model": "CosyVoice2-0.5B", "input": {"mode": "fast_replication", "text": text,
                                                  "reference_audio_id": ref or ctx.ref},
            "seed": 5, "stream": False, "output_format": "wav", **kw}
    return httpx.post(f"{ctx.url}/api/v1/audio/speech", json=body, timeout=300)


def _pai_seconds(r: httpx.Response) -> float:
    assert r.status_code == 200, r.text
    audio, rate = sf.read(io.BytesIO(base64.b64decode(r.json()["output"]["audio"]["data"])))
    return len(audio) / rate


def _pai_stream(ctx, text: str, **kw) -> list[dict]:
    body = {"model": "CosyVoice2-0.5B", "input": {"mode": "fast_replication", "text": text,
                                                  "reference_audio_id": ctx.ref},
            "seed": 5, "output_format": "pcm", **kw}
    with httpx.stream("POST", f"{ctx.url}/api/v1/audio/speech", json=body, timeout=300) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]


def test_a_sentence_longer_than_the_context_is_spoken_on_pai(ctx):
    assert _pai_seconds(_pai(ctx, COMMAS)) > 1.0
    events = _pai_stream(ctx, COMMAS)
    assert all(e["error"] is None for e in events), events[-1]
    assert events[-1]["output"]["finish_reason"] == "stop"
    pcm = b"".join(base64.b64decode(e["output"]["audio"]["data"]) for e in events if e["output"]["audio"])
    assert _decode("pcm", pcm)[0] / 24000 > 1.0


def test_a_sentence_longer_than_the_context_is_spoken_on_openai(ctx):
    wav = ctx.client.audio.speech.create(model="tts-1", voice=ctx.ref, input=COMMAS, response_format="wav",
                                         extra_body={"seed": 3}).content
    audio, rate = sf.read(io.BytesIO(wav))
    assert len(audio) / rate > 1.0
    types, pcm = [], b""
    with ctx.client.audio.speech.with_streaming_response.create(
            model="tts-1", voice=ctx.ref, input=COMMAS, response_format="pcm", stream_format="sse",
            extra_body={"seed": 3}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                types.append(event["type"])
                if event["type"] == "speech.audio.delta":
                    pcm += base64.b64decode(event["audio"])
    assert types[-1] == "speech.audio.done" and "error" not in types, types
    assert len(pcm) / 2 / 24000 > 1.0


@pytest.mark.parametrize("text, ssml", [
    (f'<speak>听好：<sub alias="{COMMAS}">天气</sub></speak>', True),
    (f'<speak>号码是<say-as interpret-as="digits">{"1234567890" * 25}</say-as></speak>', True),  # no comma
    ("1234567890。" * 20, False),  # read by the English rules, where "。" ends no sentence
], ids=["sub", "say-as", "digits"])
def test_ssml_and_english_read_long_sentences_are_spoken(ctx, text, ssml):
    assert _pai_seconds(_pai(ctx, text, enable_ssml=ssml)) > 1.0


def test_a_prompt_that_leaves_no_room_is_refused_up_front(ctx):
    """A transcript of 3-id characters takes the whole context with the voice's speech tokens: no piece of text
    fits beside it, however it is split. Refused before any audio (a 400 status, not an error event)."""
    ref = ctx.upload("𠀀" * 680)
    r = _pai(ctx, "你好。", ref=ref)
    assert r.status_code == 400, r.text
    assert "LM" in r.text and str(CONTEXT) in r.text and "prompt" in r.text
    body = {"model": "m", "input": {"mode": "fast_replication", "text": "你好。", "reference_audio_id": ref}}
    with httpx.stream("POST", f"{ctx.url}/api/v1/audio/speech", json=body, timeout=120) as s:
        assert s.status_code == 400 and "Retry-After" not in s.headers


def test_a_backend_refusal_is_a_400_naming_the_limit(small_backend, tiny_model_dir):
    from cosy.lm.pool import BackendPool
    from cosy.lm.prompt import PromptEmbedder
    from cosy.lm.remote import RemoteLM
    lm = RemoteLM(small_backend.url, API_KEY, small_backend.model_name)
    lm.check()
    pool = BackendPool([lm])
    x = PromptEmbedder.from_model_dir(tiny_model_dir)([100, 200, 300], [], [])
    with pytest.raises(CosyError) as e:
        list(pool.generate(x, 0, CONTEXT + 352, seed=0))
    assert e.value.status == 400 and e.value.retry_after is None, e.value
    assert str(CONTEXT) in str(e.value) and "max_model_len" in str(e.value)
    assert pool.dead_until[id(lm)] == 0  # the request was refused, the backend is fine


def test_a_19000_digit_text_starts_at_once_and_a_normal_request_goes_on(ctx):
    """19,000 digits cost a minute of wetext's FSTs before, with the interpreter held (the FSTs do not let go of
    it): the same worker's other requests stood still. Long digit runs are read digit by digit (as the FSTs
    read them) without the FSTs."""
    first: dict[str, float] = {}

    def digits() -> None:
        start = time.monotonic()
        body = {"model": "m", "voice": ctx.ref, "input": DIGITS, "response_format": "pcm", "seed": 1}
        with httpx.stream("POST", f"{ctx.url}/v1/audio/speech", json=body, timeout=120) as r:
            first["status"] = r.status_code
            next(r.iter_bytes())  # the first audio; closing the stream then cancels the rest
            first["seconds"] = time.monotonic() - start

    t = threading.Thread(target=digits)
    t.start()
    time.sleep(0.5)
    start = time.monotonic()
    seconds = _pai_seconds(_pai(ctx, SHORT))
    normal = time.monotonic() - start
    t.join(120)
    assert first.get("status") == 200 and seconds > 0
    assert first["seconds"] < 20 and normal < 20, (first, normal)
