"""The key gate alone (cosy.frontend.auth.KeyGate in front of a bare ASGI app, in process): the routes it must
refuse without the key and serve with it. tests/test_hostile.py checks the same routes on a real frontend."""
from __future__ import annotations

import pytest

KEY = "gate-Key-2b81"
AUTH = {"Authorization": f"Bearer {KEY}"}

PROTECTED = [  # (method, path, request kwargs) of every surface
    ("GET", "/api/v1/audio/reference_audio", {}),
    ("POST", "/api/v1/audio/reference_audio", {"files": {"file": ("a.wav", b"RIFF")}, "data": {"text": "x"}}),
    ("POST", "/api/v1/audio/speech", {"json": {"input": {}}}),
    ("POST", "/v1/audio/speech", {"json": {}}),
    ("GET", "/metrics", {}),
    ("GET", "/config", {}),
    ("GET", "/gradio_api/info", {}),
    ("POST", "/gradio_api/upload", {"files": {"files": ("a.wav", b"RIFF")}}),
    ("GET", "/gradio_api/file=/etc/hostname", {}),
    ("POST", "/gradio_api/call/list_voices", {"json": {"data": []}}),
    ("POST", "/gradio_api/call/saved_voice", {"json": {"data": ["你好", "hostile-voice", 0, 1.0]}}),
    ("POST", "/gradio_api/call/save_voice", {"json": {"data": ["v", "t", None]}}),
    ("POST", "/gradio_api/queue/join", {"json": {"data": [], "fn_index": 0, "session_hash": "x"}}),
    ("GET", "/gradio_api/queue/data?session_hash=x", {}),
    ("GET", "/nope", {}),
]


def _gated():
    """cosy.frontend.auth.KeyGate in front of a bare ASGI app that serves every path ("served"), in process."""
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from cosy.frontend.auth import KeyGate

    async def anything(request):
        return PlainTextResponse("served")

    app = Starlette(routes=[Route("/{path:path}", anything, methods=["GET", "POST"])])
    app.add_middleware(KeyGate, api_key=KEY)
    return TestClient(app)


@pytest.mark.quick
def test_the_key_gate_alone_refuses_every_protected_route_and_serves_it_with_the_key():
    """The gate's rule without a frontend (the quick tier's check of what the next test checks on the real
    app): every PROTECTED path is refused without the key, with a wrong one and with a forged session cookie,
    and served with the key; /health and /ready stay open."""
    let_through = []
    for method, path, kw in PROTECTED:
        client = _gated()  # a gate each: its wrong-key limit per address is not the point here
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Cookie": "cosy_session=forged"}):
            r = client.request(method, path, headers=headers, **kw)
            if r.status_code != 401 or "API key" not in r.text:
                let_through.append((method, path, headers, r.status_code))
        r = client.request(method, path, headers=AUTH, **kw)
        assert r.status_code == 200 and r.text == "served", (method, path, r.status_code, r.text[:200])
    assert not let_through, let_through
    assert [_gated().get(path).text for path in ("/health", "/ready")] == ["served", "served"]
