"""Language hints and the markdown filter on the real surfaces (tests/http_stack.py: a CosyVoice2 tiny-model
frontend): the PAI and OpenAI routes take `language_hints` and `enable_markdown_filter` (the same audio as the
hand-written text; unknown hints a 400 naming the field and the choices; CosyVoice2 refuses German), and the
real dashscope SDK sends both in run-task over our WebSocket (the sentences it is told of are the filtered
markdown, released block by block)."""
from __future__ import annotations

import json

import httpx
import pytest
from dashscope_client import dashscope_task
from http_stack import KEY, _error
from test_ws import ws_url

MARKDOWN = "# Hello\n\nOne **two** [three](http://x.y)."
SPOKEN = "Hello. One two three."


def _pai(stack, text: str, **options) -> httpx.Response:
    body = {"model": "CosyVoice2-0.5B", "stream": False,
            "input": {"mode": "fast_replication", "text": text, "reference_audio_id": stack.ref,
                      "output_format": "pcm", "seed": 5, **options}}
    return httpx.post(f"{stack.url}/api/v1/audio/speech", json=body, timeout=300)


def test_pai_markdown_and_hints_speak_the_hand_written_text(stack):
    want = _pai(stack, SPOKEN)
    assert want.status_code == 200, want.text
    got = _pai(stack, MARKDOWN, enable_markdown_filter=True, language_hints=["en"])
    assert got.status_code == 200, got.text
    assert got.json()["output"]["audio"]["data"] == want.json()["output"]["audio"]["data"]


def test_unknown_and_unspoken_hints_are_400s_naming_the_field(stack):
    _error(_pai(stack, "x", language_hints=["xx"]), 400, "invalid_request_error", "input.language_hints",
           "unknown language 'xx'", "zh, en, de")
    _error(_pai(stack, "x", language_hints=["de"]), 400, "invalid_request_error", "language_hints",
           "does not speak 'de'")
    _error(_pai(stack, "<speak>x</speak>", enable_ssml=True, enable_markdown_filter=True), 400,
           "invalid_request_error", "enable_markdown_filter")
    r = httpx.post(f"{stack.url}/v1/audio/speech", json={"model": "tts-1", "voice": stack.ref, "input": "x",
                                                         "language_hints": ["klingon"]}, timeout=60)
    _error(r, 400, "invalid_request_error", "language_hints", "unknown language 'klingon'")


def test_openai_route_filters_markdown(stack):
    def speak(text: str, **extra) -> bytes:
        r = httpx.post(f"{stack.url}/v1/audio/speech", json={"model": "tts-1", "voice": stack.ref, "input": text,
                                                             "response_format": "pcm", "seed": 5, **extra},
                       timeout=300)
        assert r.status_code == 200, r.text
        return r.content
    assert speak(MARKDOWN, enable_markdown_filter=True, language_hints=["en"]) == speak(SPOKEN)


def test_dashscope_sdk_sends_language_hints_and_the_markdown_filter(stack):
    url = ws_url(stack, "/api-ws/v1/inference", keyed=True)
    pieces = ["## 你", "好\n\n**今天**", "天气*很好*。\n"]
    cb = dashscope_task(url, KEY, pieces, voice=stack.ref, language_hints=["zh"],
                        additional_params={"enable_markdown_filter": True, "seed": 3})
    assert cb.completed and len(cb.audio) > 0
    # the sentences name the caller's own (markdown) text, and cover it
    assert "".join(o["original_text"] for o in cb.outputs("sentence-end")) == "".join(pieces).strip()
    # what was spoken is the filtered text: the audio of the text a person would write for it
    plain = dashscope_task(url, KEY, ["你好。", "今天天气很好。"], voice=stack.ref, additional_params={"seed": 3})
    assert bytes(cb.audio) == bytes(plain.audio)
    with pytest.raises(Exception):  # (the SDK raises the task-failed it gets)
        dashscope_task(url, KEY, ["你好。"], timeout_ms=60_000, voice=stack.ref, language_hints=["xx"])


@pytest.mark.quick
def test_batch_lines_take_the_fields_and_name_bad_ones(tmp_path):
    from cosy.batch.manifest import BadLine, parse_line

    def line(**fields):
        return parse_line(json.dumps({"id": "a", "text": "# Hi", "voice_id": "v", **fields}), 1, tmp_path, 24000)

    plain, marked = line(), line(language_hints=["de"], enable_markdown_filter=True)
    assert marked.request.language == "de" and marked.request.markdown and plain.request.language is None
    assert marked.digest != plain.digest  # a changed control redoes the line
    for fields, words in (({"language_hints": ["xx"]}, "language_hints: unknown language 'xx'"),
                          ({"enable_markdown_filter": "yes"}, "enable_markdown_filter must be true or false")):
        bad = line(**fields)
        assert isinstance(bad, BadLine) and words in bad.error, bad


@pytest.mark.quick
def test_cli_has_the_flags():
    from cosy.__main__ import build_parser

    args = build_parser().parse_args(["--model_dir", "m", "--out", "o.wav", "--mode", "cross_lingual", "--text", "# x",
                                      "--language_hints", "de",
                                      "--enable_markdown_filter"])
    assert args.language_hints == "de" and args.enable_markdown_filter


def _dashscope_audio(stack, text: str, **params) -> bytes:
    """The audio of one DashScope task sent by the real dashscope SDK, `params` as its additional parameters."""
    task = dashscope_task(ws_url(stack, "/api-ws/v1/inference", keyed=True), KEY, [text], voice=stack.ref,
                          additional_params={"seed": 9, **params})
    assert task.completed and task.error is None, task.error
    return bytes(task.audio)


def test_dashscope_sdk_sends_hot_fix_and_hears_the_hand_written_text(stack):
    """hot_fix in run-task's parameters, as the SDK sends additional parameters: the replacement is spoken
    exactly as the text written with it by hand (same seed, same audio bytes)."""
    want = _dashscope_audio(stack, "世界卫生组织的总部在日内瓦。")
    got = _dashscope_audio(stack, "WHO的总部在日内瓦。", hot_fix={"replace": [{"WHO": "世界卫生组织"}]})
    assert len(want) > 0 and got == want
    other = _dashscope_audio(stack, "WHO的总部在日内瓦。")
    assert other != want  # (the fix made the difference)


def _openai_socket_audio(stack, pieces: list[str], **config) -> tuple[bytes, dict | None]:
    """(pcm audio, the error event or None) of one session on the OpenAI-style socket."""
    import asyncio
    import base64

    import websockets

    async def main():
        async with websockets.connect(ws_url(stack, "/v1/audio/speech/stream")) as ws:
            await ws.send(json.dumps({"type": "session.config", "voice": stack.ref, "response_format": "pcm",
                                      "seed": 4, **config}))
            created = json.loads(await ws.recv())
            if created["type"] == "error":
                return b"", created
            for piece in pieces:
                await ws.send(json.dumps({"type": "input.text", "delta": piece}))
            await ws.send(json.dumps({"type": "input.done"}))
            audio, event = bytearray(), {}
            while event.get("type") not in ("speech.audio.done", "error"):
                event = json.loads(await ws.recv())
                if event["type"] == "speech.audio.delta":
                    audio += base64.b64decode(event["audio"])
            return bytes(audio), event if event["type"] == "error" else None
    return asyncio.run(main())


def test_the_openai_socket_takes_the_text_controls(stack):
    """session.config's hot_fix and enable_markdown_filter: the audio of the text written by hand."""
    want, error = _openai_socket_audio(stack, ["世界卫生组织说好。"])
    assert error is None and want
    got, error = _openai_socket_audio(stack, ["**WHO**", "说好。"], enable_markdown_filter=True,
                                      hot_fix={"replace": [{"WHO": "世界卫生组织"}]}, language_hints=["zh"])
    assert error is None and got == want
    _, error = _openai_socket_audio(stack, ["x"], language_hints=["xx"])
    assert error is not None and "language_hints" in error["error"]["message"], error
