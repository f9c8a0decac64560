"""No error on any surface names an internal address: a real HTTP stack (tests/http_stack.py's apps, a real
worker pool) whose LM backend lists the model, then answers every completion 503. Every surface's request then fails
with "the LM backend at http://127.0.0.1:PORT/v1 answered 503" (the log has it); what clients get must not."""
from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import websockets
from http_stack import ZS_TEXT, ZS_WAV, _app, _serve
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from cosy.deploy.data_dir import DataDir
from cosy.frontend.service import FrontendService
from cosy.lm.export import llm_fingerprint, served_model_name
from cosy.model.files import ModelDir
from cosy.service.workers import EngineSpec, WorkerPool


async def _models(request):
    return JSONResponse({"object": "list", "data": [{"id": request.app.state.model, "max_model_len": 32768}]})


async def _completions(request):
    return JSONResponse({"error": {"message": "engine dead"}}, status_code=503)


@pytest.fixture(scope="module")
def dead(tiny_model_dir, tmp_path_factory):
    """A backend that lists the model (the workers start) and answers every completion 503."""
    app = Starlette(routes=[Route("/v1/models", _models), Route("/v1/completions", _completions, methods=["POST"])])
    app.state.model = served_model_name(llm_fingerprint(tiny_model_dir, tmp_path_factory.mktemp("fp")),
                                        ModelDir(tiny_model_dir).family)
    backend, backend_thread, backend_url = _serve(app)
    port = int(backend_url.rsplit(":", 1)[1])
    pool = WorkerPool(EngineSpec(str(tiny_model_dir), llm_base_url=f"{backend_url}/v1", llm_api_key="k"),
                      workers=1, max_queue=8).start()
    service = FrontendService(pool, DataDir(tmp_path_factory.mktemp("data")))
    server, thread, url = _serve(_app(service, None, lambda: (True, "ok")))
    r = httpx.post(f"{url}/api/v1/audio/reference_audio", files={"file": ("p.wav", ZS_WAV.read_bytes())},
                   data={"text": ZS_TEXT}, timeout=120)
    assert r.status_code == 200, r.text
    yield url, r.json()["id"], port
    for srv, t in ((server, thread), (backend, backend_thread)):
        srv.should_exit = True
        t.join(10)
    pool.close()


def _hidden(text: str, port: int) -> None:
    assert text and f":{port}" not in text and "127.0.0.1" not in text, text


def test_http_and_sse_errors_name_no_backend_address(dead):
    url, ref, port = dead
    pai = {"input": {"mode": "fast_replication", "text": "你好。", "reference_audio_id": ref}}
    answers = [httpx.post(f"{url}/api/v1/audio/speech", json={**pai, "stream": False}, timeout=120),
               httpx.post(f"{url}/api/v1/audio/speech", json=pai, timeout=120),  # PAI SSE
               httpx.post(f"{url}/v1/audio/speech", json={"model": "tts-1", "voice": ref, "input": "你好。",
                                                          "stream_format": "sse"}, timeout=120)]
    for r in answers:
        assert "error" in r.text and "LM backend" in r.text, r.text[:300]
        _hidden(r.text, port)


def test_websocket_errors_name_no_backend_address(dead):
    url, ref, port = dead
    ws_url = url.replace("http://", "ws://")

    async def pai():
        async with websockets.connect(ws_url + "/api-ws/v1/audio/speech") as ws:
            params = {"mode": "fast_replication", "reference_audio_id": ref, "output_format": "pcm"}
            await ws.send(json.dumps({"header": {"action": "run-task", "task_id": "t", "streaming": "duplex"},
                                      "payload": {"parameters": params, "input": {}}}))
            for action, text in (("continue-task", "你好。"), ("finish-task", None)):
                payload = {"input": {"text": text}} if text else {"input": {}}
                await ws.send(json.dumps({"header": {"action": action, "task_id": "t", "streaming": "duplex"},
                                          "payload": payload}))
            while True:
                e = json.loads(await asyncio.wait_for(ws.recv(), 120))
                if e["header"]["event"] in ("task-failed", "task-finished"):
                    return e

    async def openai_style():
        async with websockets.connect(ws_url + "/v1/audio/speech/stream") as ws:
            await ws.send(json.dumps({"type": "session.config", "voice": ref, "response_format": "pcm"}))
            json.loads(await ws.recv())
            await ws.send(json.dumps({"type": "input.text", "delta": "你好。"}))
            await ws.send(json.dumps({"type": "input.done"}))
            while True:
                e = json.loads(await asyncio.wait_for(ws.recv(), 120))
                if e["type"] in ("error", "speech.audio.done"):
                    return e

    for event in (asyncio.run(pai()), asyncio.run(openai_style())):
        text = json.dumps(event, ensure_ascii=False)
        assert "LM backend" in text, text
        _hidden(text, port)



@pytest.mark.quick
def test_public_message_keeps_our_routes_and_the_clients_words_and_hides_the_rest():
    from cosy.errors import public_message
    # the soak found "GET <file> lists them": a route we name for the client is not a server path
    assert public_message("unknown reference audio (voice) id 'x': GET /api/v1/audio/reference_audio lists them") \
        == "unknown reference audio (voice) id 'x': GET /api/v1/audio/reference_audio lists them"
    for route in ("/v1/audio/speech", "/api-ws/v1/inference", "/gradio_api/call/zero_shot"):
        assert public_message(f"use {route} instead") == f"use {route} instead"
    assert public_message("cannot read /data/uploads/ab12.wav any more") == "cannot read <file> any more"
    assert public_message("the LM backend at http://10.0.0.7:8000/v1 answered 503") \
        == "the LM backend at <backend> answered 503"
    assert public_message("at 10.0.0.7:8000/v1/completions: refused") == "at <backend>/v1/completions: refused"
    assert public_message("no route /srv/x/y", echoed=("/srv/x/y",)) == "no route /srv/x/y"
