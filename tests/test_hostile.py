"""Hostile requests against a real frontend (`python app.py --api_key_file ...`, embedded LM on the tiny model):
every surface behind the key, bad input refused 4xx with a reason naming the field, the server healthy
after, refused requests leaving the data dir's voices unchanged, and the key never in an answer, a log
line, /metrics or the process's command line."""
from __future__ import annotations

import io
import json
import time

import httpx
import numpy as np
import psutil
import pytest
import soundfile as sf
from conftest import ASSETS
from gradio_client import Client, handle_file
from servers import App
from test_auth import PROTECTED  # every surface behind the key (the gate alone is checked there)

KEY = "hostile-Key-7f3a9c"
ZS_WAV = ASSETS / "zero_shot_prompt.wav"
ZS_TEXT = "希望你以后能够做的比我还好呦。"
AUTH = {"Authorization": f"Bearer {KEY}"}
SEEN: list[str] = []  # every answer's headers and body, checked for the key at the end


@pytest.fixture(scope="module")
def app(tiny_model_dir, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile")
    key_file = tmp / "key"
    key_file.write_text(KEY + "\n")  # the trailing newline is stripped
    a = App("--model_dir", str(tiny_model_dir), "--data_dir", str(tmp / "data"), "--api_key_file", str(key_file),
            "--header_timeout", "3")
    a.wait()
    a.data = tmp / "data"
    c = Client(a.url, verbose=False, headers=AUTH)
    c.predict("hostile-voice", ZS_TEXT, handle_file(str(ZS_WAV)), api_name="/save_voice")
    yield a
    a.stop()


def _seen(r: httpx.Response) -> httpx.Response:
    SEEN.append(json.dumps(dict(r.headers)) + r.text)
    return r


def get(app, path, **kw):
    return _seen(httpx.get(app.url.rstrip("/") + path, timeout=60, **kw))


def post(app, path, **kw):
    return _seen(httpx.post(app.url.rstrip("/") + path, timeout=120, **kw))


def error(r: httpx.Response, status: int, *words: str) -> str:
    assert r.status_code == status, (r.status_code, r.text[:500])
    msg = r.json()["error"]["message"]
    for w in words:
        assert w in msg, msg
    return msg


def voices(app) -> set[str]:
    return {str(p.relative_to(app.data)) for p in (app.data / "voices").rglob("*")}


def healthy(app) -> None:
    assert get(app, "/health").json() == {"status": "ok"}
    assert get(app, "/ready").json() == {"status": "ready"}


def float_wav(samples: np.ndarray, rate: int = 24000) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples.astype(np.float32), rate, format="WAV", subtype="FLOAT")
    return buf.getvalue()


def speech_wav(scale: float = 1.0, poison: float | None = None) -> bytes:
    audio, rate = sf.read(ZS_WAV, dtype="float32")
    audio = audio * scale
    if poison is not None:
        audio[1000:1010] = poison
    return float_wav(audio, rate)


# --- one authentication story ---------------------------------------------------------------------------------

@pytest.mark.parametrize("method,path,kw", PROTECTED, ids=[f"{m} {p}" for m, p, _ in PROTECTED])
def test_without_the_key_every_protected_route_refuses(app, method, path, kw):
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Cookie": "cosy_session=forged"}):
        r = _seen(httpx.request(method, app.url.rstrip("/") + path, headers=headers, timeout=30, **kw))
        error(r, 401, "API key")


def test_the_webui_shows_its_login_and_the_key_logs_in(app):
    page = get(app, "/")
    assert page.status_code == 401 and "text/html" in page.headers["content-type"]
    assert 'type="password"' in page.text and "gradio_config" not in page.text
    error(post(app, "/login", data={"username": "u", "password": "wrong"}), 401, "wrong API key")
    r = post(app, "/login", data={"username": "webui", "password": KEY})
    assert r.status_code == 200 and KEY not in r.headers["set-cookie"]
    page = get(app, "/", cookies=r.cookies)
    assert page.status_code == 200 and "gradio" in page.text.lower() and 'id="login"' not in page.text
    assert get(app, "/gradio_api/info", cookies=r.cookies).status_code == 200


def test_wrong_keys_from_one_address_are_limited_and_other_addresses_are_not(app):
    """Key guessing: past 30 wrong keys a minute from one address (here 127.0.0.3, the loopback's other
    name), that address gets 429 with Retry-After, the right key included; 127.0.0.1 logs in at once."""
    url = app.url.rstrip("/")
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.3"), timeout=30) as guesser:
        statuses = [guesser.post(f"{url}/login", data={"password": f"guess{i}"}).status_code for i in range(34)]
        assert statuses[:30] == [401] * 30 and set(statuses[30:]) == {429}, statuses
        for r in (guesser.post(f"{url}/login", data={"password": KEY}),
                  guesser.get(f"{url}/api/v1/audio/reference_audio", headers={"Authorization": "Bearer other"})):
            error(r, 429, "too many wrong API keys")
            assert 1 <= int(r.headers["retry-after"]) <= 60
    assert post(app, "/login", data={"password": KEY}).status_code == 200


def test_gradio_client_without_the_key_is_refused(app):
    with pytest.raises(Exception):
        Client(app.url, verbose=False)
    with pytest.raises(Exception):
        Client(app.url, verbose=False, auth=("any", "wrong"))


def test_with_the_key_every_surface_works(app):
    for client in (Client(app.url, verbose=False, headers=AUTH), Client(app.url, verbose=False, auth=("any", KEY))):
        path = client.predict("你好。", ZS_TEXT, handle_file(str(ZS_WAV)), 1, 1.0, api_name="/zero_shot")
        assert sf.info(path).samplerate == 24000
        assert "hostile-voice" in [v["voice_id"] for v in client.predict(api_name="/list_voices")]
    r = post(app, "/gradio_api/call/list_voices", json={"data": []}, headers=AUTH)
    assert r.status_code == 200
    events = get(app, f"/gradio_api/call/list_voices/{r.json()['event_id']}", headers=AUTH).text
    assert "event: complete" in events and "hostile-voice" in events
    assert get(app, "/api/v1/audio/reference_audio", headers=AUTH).status_code == 200
    assert get(app, "/api/v1/audio/reference_audio", headers={"Authorization": KEY}).status_code == 200  # PAI-EAS
    r = post(app, "/v1/audio/speech", headers=AUTH, json={"model": "m", "voice": "hostile-voice", "input": "你好",
                                                          "response_format": "wav"})
    assert r.status_code == 200 and sf.info(io.BytesIO(r.content)).samplerate == 24000
    assert "cosy_http_requests_total" in get(app, "/metrics", headers=AUTH).text
    healthy(app)  # open without the key


# --- one validation layer, over HTTP ------------------------------------------------------------------------

REF = "/api/v1/audio/reference_audio"


def _multipart(boundary: bytes, parts: list[tuple[str, str | None, bytes]]) -> bytes:
    out = b""
    for name, filename, data in parts:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += b"--" + boundary + b"\r\nContent-Disposition: " + disp.encode() + b"\r\n\r\n" + data + b"\r\n"
    return out + b"--" + boundary + b"--\r\n"


def test_malformed_bodies_are_400_not_500(app):
    before = voices(app)
    wav = ZS_WAV.read_bytes()
    ct = {"Content-Type": "multipart/form-data; boundary=XyZ", **AUTH}
    two_files = _multipart(b"XyZ", [("file", "a.wav", wav), ("file", "b.wav", wav), ("text", None, b"t")])
    error(post(app, REF, content=two_files, headers=ct), 400, "malformed request body")
    error(post(app, REF, content=_multipart(b"XyZ", [("file", "a.wav", wav)]),
               headers={"Content-Type": "multipart/form-data; boundary=other", **AUTH}), 400)
    error(post(app, REF, content=b"\x00\xff garbage \r\n--", headers=ct), 400)
    many = _multipart(b"XyZ", [(f"f{i}", None, b"v") for i in range(2000)])
    error(post(app, REF, content=many, headers=ct), 400, "malformed request body")
    big_field = _multipart(b"XyZ", [("file", "a.wav", wav), ("text", None, b"x" * (2 << 20))])
    error(post(app, REF, content=big_field, headers=ct), 400, "malformed request body")
    deep = b"[" * 200_000 + b"]" * 200_000
    for path in ("/api/v1/audio/speech", "/v1/audio/speech"):
        error(post(app, path, content=deep, headers={"Content-Type": "application/json", **AUTH}), 400)
    error(post(app, "/api/v1/audio/speech", content=b"{not json", headers={"Content-Type": "application/json",
                                                                         **AUTH}), 400, "JSON")
    healthy(app)
    assert voices(app) == before


def test_chunked_huge_upload_says_it_is_over_the_limit(app):
    head = (b"--XyZ\r\nContent-Disposition: form-data; name=\"text\"\r\n\r\nt\r\n"
            b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n")

    def body():
        yield head
        for _ in range(60):
            yield b"\0" * (1 << 20)
        yield b"\r\n--XyZ--\r\n"

    r = post(app, REF, content=body(), headers={"Content-Type": "multipart/form-data; boundary=XyZ", **AUTH})
    msg = error(r, 413, "larger than the limit of 20 MB")
    assert "20.0 MB" not in msg
    healthy(app)


def test_bad_uploads_and_fields_name_what_is_wrong(app):
    before = voices(app)
    wav = ZS_WAV.read_bytes()
    pcm = (np.sin(np.arange(32000) / 5) * 8000).astype("<i2").tobytes()

    def upload(data=wav, name="a.wav", text=ZS_TEXT, **fields):
        return post(app, REF, files={"file": (name, data)}, data={"text": text, **fields}, headers=AUTH)

    for rate in ("1000000000000", "0", "-16000", "abc", "16000.5"):
        error(upload(pcm, "a.pcm", sample_rate=rate), 400, "sample_rate")
    error(upload(text="字" * 25000), 400, "'text' is 25000 characters; the limit is 1000")
    error(upload(text="\u200b\u200b\x00"), 400, "'text'", "nothing to speak")
    error(upload(speech_wav(poison=float("nan"))), 400, "NaN")
    error(upload(speech_wav(poison=float("inf"))), 400, "NaN or infinite")
    error(upload(speech_wav(scale=40.0)), 400, "too loud", "limit is 2")
    assert voices(app) == before

    def speech(**inp):
        body = {"model": "m", "stream": False, "input": {"mode": "fast_replication", "text": "你好",
                                                         "reference_audio_id": "hostile-voice", **inp}}
        return post(app, "/api/v1/audio/speech", json=body, headers=AUTH)

    for text in ("\x00\x00", "\u200b\u200c\u200d\ufeff", " \t\n"):
        error(speech(text=text), 400, "text", "nothing to speak")
    error(speech(mode="natural_language_replication", instruct="慢" * 25000), 400, "instruct", "25000")
    for field, value in (("seed", -1), ("seed", 2**31), ("seed", "x"), ("speed", 9), ("speed", "fast"),
                         ("volume", 11), ("volume", "loud"), ("sample_rate", 0), ("sample_rate", -1),
                         ("sample_rate", 10**12), ("bit_rate", "1G"), ("bit_rate", -5)):
        error(speech(**{field: value}), 400, field)
    for limit in ("0", "100000", "abc"):
        error(get(app, REF, params={"limit": limit}, headers=AUTH), 400, "limit")
    r = post(app, "/v1/audio/speech", headers=AUTH, json={"model": "m", "voice": "hostile-voice", "input": "\u200b"})
    error(r, 400, "nothing to speak")
    healthy(app)
    assert voices(app) == before


def test_long_values_are_quoted_in_part_and_odd_numbers_are_a_400(app):
    """A value an error names is quoted up to 80 characters (a 100,000-character id came back whole); a
    bit rate of digits int() cannot read ('²', 5,000 digits) is a 400 naming it (was a 500); a raw gradio
    call nested too deeply is a 400 (was a 500 from our middleware)."""
    def speech(**inp):
        body = {"model": "m", "stream": False, "input": {"mode": "fast_replication", "text": "你好",
                                                         "reference_audio_id": "hostile-voice", **inp}}
        return post(app, "/api/v1/audio/speech", json=body, headers=AUTH)

    long_id = "v" * 100_000
    for r in (speech(reference_audio_id=long_id),
              post(app, "/v1/audio/speech", json={"model": "m", "voice": long_id, "input": "你好"}, headers=AUTH)):
        msg = error(r, 400, "invalid reference audio id 'vvv")
        assert len(msg) < 300, len(msg)
    for rate in ("²", "9" * 5000, "1" * 20):
        msg = error(speech(bit_rate=rate), 400, "bit_rate", "is not a bit rate")
        assert len(msg) < 300, len(msg)
    deep = b'{"data": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r = post(app, "/gradio_api/call/saved_voice", content=deep, headers={"Content-Type": "application/json", **AUTH})
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    healthy(app)


def test_api_json_bodies_past_what_a_request_needs_are_refused(app):
    """A JSON body on the speech routes is at most 1 MiB (20,000 characters at 12 bytes JSON-escaped fit):
    a larger one is a 413 before it is read and parsed (one with a Content-Length at once, a chunked one
    once it passes the bound); one at the bound is read and answered as usual."""
    padded = json.dumps({"model": "m", "voice": "hostile-voice", "input": "😀" * 20_001}) + " " * 100_000
    assert len(padded) > 300_000
    error(post(app, "/v1/audio/speech", content=padded, headers={"Content-Type": "application/json", **AUTH}), 400,
          "20001 characters; the limit is 20000")
    big = b'{"model": "m", "voice": "hostile-voice", "input": "' + b"x" * (2 << 20) + b'"}'

    def chunks():
        for i in range(0, len(big), 1 << 16):
            yield big[i:i + (1 << 16)]

    for path in ("/v1/audio/speech", "/api/v1/audio/speech"):
        for content in (big, chunks()):
            msg = error(post(app, path, content=content, headers={"Content-Type": "application/json", **AUTH}), 413,
                        "request body", "1 MiB")
            assert len(msg) < 300
    healthy(app)


def test_a_nul_in_a_filename_is_not_stored(app):
    body = _multipart(b"XyZ", [("file", "my\x00voice\u202e.wav", ZS_WAV.read_bytes()),
                               ("text", None, ZS_TEXT.encode())])  # raw: httpx would percent-encode the NUL
    r = post(app, REF, content=body, headers={"Content-Type": "multipart/form-data; boundary=XyZ", **AUTH})
    assert r.status_code == 200, r.text
    obj = r.json()
    try:
        assert obj["filename"] == "myvoice.wav"
        assert get(app, f"{REF}/{obj['id']}", headers=AUTH).json()["filename"] == "myvoice.wav"
    finally:
        httpx.delete(app.url.rstrip("/") + f"{REF}/{obj['id']}", headers=AUTH)


# --- the same rules through the gradio API ------------------------------------------------------------------


def raw_call(app, name: str, data: list) -> str:
    """A raw gradio API call: the text of its SSE result stream."""
    r = post(app, f"/gradio_api/call/{name}", json={"data": data}, headers=AUTH)
    assert r.status_code == 200, r.text
    return get(app, f"/gradio_api/call/{name}/{r.json()['event_id']}", headers=AUTH).text


RAW_BAD = [  # /saved_voice(tts_text, voice_id, seed, speed) -> what the error must say
    (["你好", "hostile-voice", "abc", 1.0], "seed must be a number"),
    (["你好", "hostile-voice", 2**31, 1.0], "seed 2147483648 is out of range"),
    (["你好", "hostile-voice", -1, 1.0], "seed -1 is out of range"),
    (["你好", "hostile-voice", 1.5, 1.0], "seed must be a whole number"),
    (["你好", "hostile-voice", 0, "fast"], "speed must be a number"),
    (["你好", "hostile-voice", 0, 1e308], "speed"),
    ([12345, "hostile-voice", 0, 1.0], "text must be a string"),
    (["\x00\u200b", "hostile-voice", 0, 1.0], "nothing to speak"),
    (["你好", ["hostile-voice"], 0, 1.0], "voice"),
]


@pytest.mark.parametrize("data,words", RAW_BAD, ids=[w for _, w in RAW_BAD])
def test_raw_gradio_calls_get_our_reasons(app, data, words):
    text = raw_call(app, "saved_voice", data)
    assert "event: error" in text and words in text, text
    assert "invalid literal" not in text and "Traceback" not in text and "validation error" not in text


def test_gradio_client_bad_input_names_the_field_and_no_path(app, tmp_path):
    c = Client(app.url, verbose=False, headers=AUTH)
    before = voices(app)
    cases = [
        (("你好。", ZS_TEXT, "nan.wav", speech_wav(poison=float("nan")), 0, 1.0), "NaN"),
        (("你好。", ZS_TEXT, "loud.wav", speech_wav(scale=40.0), 0, 1.0), "too loud"),
        (("你好。", "字" * 25000, "ok.wav", ZS_WAV.read_bytes(), 0, 1.0), "prompt_text is 25000 characters"),
        (("\u200b\u200b", ZS_TEXT, "ok.wav", ZS_WAV.read_bytes(), 0, 1.0), "nothing to speak"),
        (("你好。", ZS_TEXT, "ok.wav", ZS_WAV.read_bytes(), 2**31, 1.0), "seed 2147483648 is out of range"),
        (("你好。", ZS_TEXT, "ok.wav", ZS_WAV.read_bytes(), 0, 7.0), "speed 7.0 is out of range"),
    ]
    for (text, prompt_text, name, data, seed, speed), words in cases:
        f = tmp_path / name
        f.write_bytes(data)
        with pytest.raises(Exception) as e:
            c.predict(text, prompt_text, handle_file(str(f)), seed, speed, api_name="/zero_shot")
        msg = str(e.value)
        assert words in msg and "/uploads/" not in msg and str(app.data) not in msg and "/tmp" not in msg, msg
    with pytest.raises(Exception, match="prompt_text is 25000 characters"):
        c.predict("v-long", "字" * 25000, handle_file(str(ZS_WAV)), api_name="/save_voice")
    assert voices(app) == before  # (refused gradio uploads stay in DATA_DIR/uploads: pruning is not this test's)
    healthy(app)


# --- one WebSocket message ----------------------------------------------------------------------------------


def ws_url(app, path: str) -> str:
    return app.url.rstrip("/").replace("http://", "ws://") + path


def task_message(action: str, task_id: str, **payload) -> str:
    return json.dumps({"header": {"action": action, "task_id": task_id, "streaming": "duplex"}, "payload": payload})


class HealthWatch:
    """GET /health over and over in a thread while a test runs: the slowest answer (an event loop held by
    one message answers nothing)."""

    def __init__(self, app):
        import threading
        self.url, self.slowest, self.answers = app.url.rstrip("/") + "/health", 0.0, 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=60) as c:
            while not self.done.is_set():
                start = time.monotonic()
                assert c.get(self.url).status_code == 200
                self.slowest, self.answers = max(self.slowest, time.monotonic() - start), self.answers + 1
                time.sleep(0.02)

    def __enter__(self) -> "HealthWatch":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join(60)


def test_one_websocket_message_cannot_hold_the_frontend(app):
    """A DashScope continue-task of <!DOCTYPE and 400,000 blanks with enable_ssml held the event loop (the
    start-of-document pattern backtracked quadratically, before the length check): it is now
    refused at once by the 20,000-character limit, and one inside the limit by the SSML parser, while /health
    answers throughout."""
    import asyncio

    import websockets

    async def one(text: str) -> tuple[dict, float]:
        async with websockets.connect(ws_url(app, "/api-ws/v1/inference"), additional_headers=AUTH,
                                      max_size=None) as ws:
            params = {"voice": "hostile-voice", "format": "wav", "sample_rate": 24000, "enable_ssml": True}
            await ws.send(task_message("run-task", "t1", task_group="audio", task="tts", function="SpeechSynthesizer",
                                       model="cosyvoice-v2", parameters=params, input={}))
            assert json.loads(await asyncio.wait_for(ws.recv(), 60))["header"]["event"] == "task-started"
            start = time.monotonic()
            await ws.send(task_message("continue-task", "t1", input={"text": text}))
            event = json.loads(await asyncio.wait_for(ws.recv(), 20))
            return event["header"], time.monotonic() - start

    with HealthWatch(app) as health:
        time.sleep(0.2)
        over, took_over = asyncio.run(one("<!DOCTYPE" + " " * 400_000))
        inside, took_inside = asyncio.run(one("<!DOCTYPE" + " " * 19_990))
        time.sleep(0.2)
    assert over["event"] == "task-failed" and over["error_code"] == "InvalidParameter", over
    assert "400009 characters; the limit is 20000" in over["error_message"], over
    assert inside["event"] == "task-failed" and inside["error_message"].startswith("SSML line 1"), inside
    assert took_over < 1.0 and took_inside < 1.0, (took_over, took_inside)
    assert health.answers >= 5 and health.slowest < 1.0, (health.answers, health.slowest)
    healthy(app)


def test_a_websocket_message_over_the_protocols_size_is_closed_with_1009(app):
    """The largest message the protocol allows (20,000 characters, each a JSON-escaped surrogate pair: 12
    bytes) is read and answered; one of 2 MiB is closed at once with 1009 (message too big), not read into
    memory and parsed (uvicorn's default allows 16 MiB)."""
    import asyncio

    import websockets

    async def run() -> tuple[dict, int, str]:
        url = ws_url(app, "/api-ws/v1/audio/speech")
        async with websockets.connect(url, additional_headers=AUTH, max_size=None) as ws:
            params = {"mode": "cross_lingual_replication", "reference_audio_id": "hostile-voice"}
            await ws.send(task_message("run-task", "t2", parameters=params, input={}))
            assert json.loads(await asyncio.wait_for(ws.recv(), 60))["header"]["event"] == "task-started"
            largest = json.dumps(json.loads(task_message("continue-task", "t2", input={"text": "😀" * 20_001})))
            assert len(largest) > 240_000
            await ws.send(largest)
            answered = json.loads(await asyncio.wait_for(ws.recv(), 20))["header"]
        async with websockets.connect(url, additional_headers=AUTH, max_size=None) as ws:
            await ws.send(task_message("continue-task", "t3", input={"text": "x" * (2 << 20)}))
            with pytest.raises(websockets.ConnectionClosed) as e:
                await asyncio.wait_for(ws.recv(), 20)
            return answered, e.value.rcvd.code, e.value.rcvd.reason

    answered, code, reason = asyncio.run(run())
    assert answered["event"] == "task-failed" and "20001 characters; the limit is 20000" in answered["error_message"]
    assert code == 1009, (code, reason)
    healthy(app)


# --- the key stays secret ---------------------------------------------------------------------------------


def test_the_key_is_in_no_answer_log_metrics_or_command_line(app):
    metrics = get(app, "/metrics", headers=AUTH).text
    assert KEY not in metrics
    assert SEEN and not [s for s in SEEN if KEY in s]
    assert KEY not in "".join(app.lines)
    assert KEY not in " ".join(psutil.Process(app.proc.pid).cmdline())


# --- key files ------------------------------------------------------------------------------------------


def test_key_files_are_read_and_bad_ones_stop_the_start(tmp_path, capsys):
    from cosy.deploy.backend import parse_args as backend_args
    from cosy.frontend.server import parse_args

    f = tmp_path / "k"
    f.write_text("abc\n")
    args = parse_args(["--api_key_file", str(f), "--llm_api_key_file", str(f)])
    assert (args.api_key, args.llm_api_key) == ("abc", "abc")
    assert backend_args(["--model_dir", "m", "--api_key_file", str(f)])[0].api_key == "abc"
    (tmp_path / "empty").write_text("\n")
    for bad, words in ((tmp_path / "missing", "no such file"), (tmp_path / "empty", "is empty")):
        for parse, flags in ((parse_args, ["--api_key_file"]), (parse_args, ["--llm_api_key_file"]),
                             (lambda a: backend_args(["--model_dir", "m", *a]), ["--api_key_file"])):
            with pytest.raises(SystemExit) as e:
                parse([*flags, str(bad)])
            assert e.value.code == 2
            err = capsys.readouterr().err
            assert flags[0] in err and words in err, err


def test_connections_that_never_finish_their_request_head_are_closed(app):
    """50 connections that send half a request line (slowloris) are closed after --header_timeout (3 s here);
    a request whose body comes slowly after its headers is not cut, and the server serves throughout."""
    import socket
    host, port = "127.0.0.1", int(app.url.rstrip("/").rsplit(":", 1)[1])
    socks = []
    for _ in range(50):
        s = socket.create_connection((host, port), timeout=30)
        s.sendall(b"GET /health HT")
        socks.append(s)
    start = time.monotonic()
    assert get(app, "/health").status_code == 200  # serving beside them
    slow = socket.create_connection((host, port), timeout=30)
    slow.sendall(b"POST /login HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                 b"Content-Length: 12\r\n\r\n")
    closed = [s.recv(1) for s in socks]  # b"": closed by the server
    waited = time.monotonic() - start
    assert closed == [b""] * 50 and waited < 10, (closed[:3], waited)
    slow.sendall(b"password=no!")  # the body, after the head deadline passed
    assert slow.recv(64).startswith(b"HTTP/1.1 401")
    for s in (*socks, slow):
        s.close()
