"""The backend's keepalive middleware (cosy.vllm_plugin.keepalive) on a real uvicorn server with a real httpx
client: a streaming completion that waits (as one vLLM queues does) sends SSE comments until its first data,
none after it, and other responses pass unchanged."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest
import uvicorn
from servers import free_port
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from cosy.vllm_plugin.keepalive import COMMENT, INTERVAL, QueueKeepalive

WAIT = 5.0  # seconds before the first token
READ_TIMEOUT = 2.5  # the client's, as a frontend's --llm_stall_timeout (comments come every 1 s)


async def completions(request):
    gap = float(request.query_params.get("gap", 0))

    async def tokens():
        await asyncio.sleep(WAIT)  # queued
        yield b'data: {"t": 1}\n\n'
        await asyncio.sleep(gap)  # a stall between tokens
        yield b'data: {"t": 2}\n\n'
        yield b"data: [DONE]\n\n"
    return StreamingResponse(tokens(), media_type="text/event-stream")


def _chunk(tokens: list[int], finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": "", "finish_reason": finish, "logprobs": None, "token_ids": tokens}
    body = {"id": "c", "object": "text_completion", "created": 0, "model": "m", "choices": [choice]}
    return f"data: {json.dumps(body)}\n\n".encode()


async def lm_completions(request):
    """A completion stream as vLLM's: `model` "never" waits forever (the middleware's keep-alives only, as an
    engine that froze behind a live API server), "queued" waits WAIT s, then two tokens."""
    model = (await request.json())["model"]

    async def tokens():
        await asyncio.sleep(3600 if model == "never" else WAIT)
        yield _chunk([5])
        yield _chunk([6], "length")
        yield b"data: [DONE]\n\n"
    return StreamingResponse(tokens(), media_type="text/event-stream")


async def models(request):
    return JSONResponse({"data": []})


@pytest.fixture(scope="module")
def server():
    app = Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]), Route("/v1/models", models),
                            Route("/lm/v1/completions", lm_completions, methods=["POST"])])
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(QueueKeepalive(app), host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=srv.run, daemon=True).start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1"
    srv.should_exit = True


def read(url: str, gap: float = 0.0) -> list[tuple[float, bytes]]:
    lines, start = [], time.monotonic()
    with httpx.stream("POST", f"{url}/completions?gap={gap}", json={}, timeout=httpx.Timeout(READ_TIMEOUT)) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line:
                lines.append((time.monotonic() - start, line.encode()))
    return lines


def test_comments_keep_a_waiting_stream_alive_until_its_first_token(server):
    lines = [line for _, line in read(server)]
    data = [line for line in lines if line.startswith(b"data:")]
    assert data == [b'data: {"t": 1}', b'data: {"t": 2}', b"data: [DONE]"]
    first = lines.index(data[0])
    assert lines[first:] == data  # nothing added after the first token
    assert len(lines[:first]) >= 3 and all(line + b"\n\n" == COMMENT for line in lines[:first])  # ~1 a second


def test_a_stall_after_the_first_token_stays_silent(server):
    with pytest.raises(httpx.ReadTimeout):  # no comments between tokens: the frontend's stall timeout works
        read(server, gap=2 * READ_TIMEOUT)


@pytest.mark.quick
def test_the_backend_serves_with_it(tmp_path):
    import json

    from cosy.deploy.backend import parse_args, vllm_command
    from cosy.vllm_plugin import KEEPALIVE
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    args, extra = parse_args(["--model_dir", str(tmp_path), "--no_api_key"])
    cmd = vllm_command(args, tmp_path, "m", False, extra)[0]
    assert cmd[cmd.index("--middleware") + 1] == KEEPALIVE == f"{QueueKeepalive.__module__}.QueueKeepalive"


@pytest.mark.quick
def test_other_routes_pass_unchanged(server):
    r = httpx.get(f"{server}/models", timeout=5)
    assert r.status_code == 200 and r.json() == {"data": []}


def test_the_token_clock_counts_tokens_not_keepalives(server):
    """RemoteLM (the frontend's client): a request queued WAIT s behind keep-alives is served (queued is not
    stalled, though the keep-alives come more often than the stall timeout allows between tokens); one that
    gets only keep-alives fails after --llm_queue_timeout with that said, not after the client's patience."""
    import torch

    from cosy.lm.remote import BackendUnavailable, RemoteLM
    embeds = torch.zeros(1, 3, 8)
    url = server.removesuffix("/v1") + "/lm/v1"
    queued = RemoteLM(url, None, "queued", stall_timeout=READ_TIMEOUT, queue_timeout=3 * WAIT)
    assert list(queued.complete(embeds, 2, stop=[])) == [5, 6]
    never = RemoteLM(url, None, "never", stall_timeout=READ_TIMEOUT, queue_timeout=WAIT)
    start = time.monotonic()
    with pytest.raises(BackendUnavailable, match="no token in 5 s, only its queue keep-alives"):
        list(never.complete(embeds, 2, stop=[]))
    assert WAIT <= time.monotonic() - start < WAIT + 3


def test_a_cancel_closes_a_stream_that_waits_in_the_queue(server):
    """A one-job worker's cancel (`WATCHDOG.abort_when`, set by cosy.service.process) reaches a request that
    reads only keep-alives: it ends with Cancelled within the watchdog's tick, not at --llm_queue_timeout, and
    the next request of the process is not touched once the cancel is cleared."""
    import torch

    from cosy.errors import Cancelled
    from cosy.lm.remote import RemoteLM
    from cosy.lm.watchdog import TICK, WATCHDOG
    embeds = torch.zeros(1, 3, 8)
    url = server.removesuffix("/v1") + "/lm/v1"
    cancel = threading.Event()
    WATCHDOG.abort_when(cancel)
    try:
        never = RemoteLM(url, None, "never", stall_timeout=READ_TIMEOUT, queue_timeout=60)
        threading.Timer(1.0, cancel.set).start()
        start = time.monotonic()
        with pytest.raises(Cancelled):
            list(never.complete(embeds, 2, stop=[]))
        # closed by the watchdog at its next tick, the read ends at the next bytes: a keep-alive, every INTERVAL
        assert 1.0 <= time.monotonic() - start < 1.0 + TICK + INTERVAL + 0.5
        cancel.clear()  # the next job
        queued = RemoteLM(url, None, "queued", stall_timeout=READ_TIMEOUT, queue_timeout=3 * WAIT)
        assert list(queued.complete(embeds, 2, stop=[])) == [5, 6]
    finally:
        WATCHDOG.abort_when(None)
