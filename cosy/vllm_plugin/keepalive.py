"""Keep a queued streaming completion visibly alive until its first token (an ASGI middleware of the
backend's vLLM server, `--middleware cosy.vllm_plugin.keepalive.QueueKeepalive`).

vLLM answers a streaming completion's headers at once and its first data when the first token exists. A
request that waits in vLLM's queue (more requests at once than `--max_num_seqs`, e.g. eight frontends on one
backend) sends nothing meanwhile, and a frontend cannot tell that from a frozen backend: its
`--llm_stall_timeout` would fail the request (or move it to another backend, to the end of that queue).
Until the first data of an event-stream response this sends an SSE comment every INTERVAL seconds (SSE
clients, the openai client included, ignore comments). From the first token on nothing is added, so a
stall between tokens still shows as silence; a frozen server process sends no comments either.
"""
from __future__ import annotations

import asyncio
import contextlib

INTERVAL = 1.0  # seconds between comments; well under any sensible --llm_stall_timeout
COMMENT = b": queued\n\n"


class QueueKeepalive:
    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or \
                not scope.get("path", "").endswith("/completions"):
            await self.app(scope, receive, send)
            return
        lock = asyncio.Lock()
        quiet = asyncio.Event()  # set once data went out (or the response ended): no more comments
        ticker: asyncio.Task | None = None

        async def tick() -> None:
            with contextlib.suppress(Exception):  # the client went away: the app's own send notices
                while not quiet.is_set():
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(quiet.wait(), INTERVAL)
                    async with lock:
                        if quiet.is_set():
                            return
                        await send({"type": "http.response.body", "body": COMMENT, "more_body": True})

        async def relay(message) -> None:
            nonlocal ticker
            async with lock:
                if message["type"] == "http.response.body" and (message.get("body") or
                                                                 not message.get("more_body", False)):
                    quiet.set()
                await send(message)
            if message["type"] == "http.response.start" and message.get("status") == 200 and \
                    dict(message.get("headers") or []).get(b"content-type", b"").startswith(b"text/event-stream"):
                ticker = asyncio.create_task(tick())

        try:
            await self.app(scope, receive, relay)
        finally:
            quiet.set()
            if ticker is not None:
                ticker.cancel()
