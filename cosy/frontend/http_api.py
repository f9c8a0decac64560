"""The frontend's HTTP APIs on the app that also serves the WebUI (Gradio mounted at "/").

    app = FastAPI()
    install(app, service, api_key=args.api_key, ready=lambda: (True, "ok"))   # before mounting Gradio
    app = gr.mount_gradio_app(app, blocks, path="/")

Routes: the PAI-compatible API under /api/v1/audio (cosy.frontend.pai_api), OpenAI's POST
/v1/audio/speech (cosy.frontend.openai_api), GET /health (the process is up; no key), GET /ready (models
loaded and LM backend reachable, else 503 with the reason; no key, for load balancers), GET /metrics
(Prometheus). With `api_key`, every other route of the app (Gradio's too: cosy.frontend.auth.KeyGate)
needs `Authorization: Bearer <key>` (or the bare key, as PAI-EAS clients send it), else 401. Errors have
one JSON shape (cosy.frontend.api_routing).

A JSON request body (every API route but the multipart upload) is at most MAX_BODY_BYTES: a larger one is a 413
before it is read and parsed (uvicorn itself bounds no body).

Routing with Gradio at "/": a root mount matches every path, so (1) `install` must run before Gradio is
mounted (`cosy.frontend.server.build_app` does), and (2) `ApiGate`, a middleware that looks at each
request before routing, answers the paths that
neither the API nor any of the app's other routes nor Gradio's own routes serve: 404 in our JSON shape
with the list of API routes; an API path with the wrong method gets 405. Gradio's paths (its page, assets,
queue, its own 404s for missing files) pass untouched.
"""
from __future__ import annotations

import hmac
import time
from collections.abc import Callable

from fastapi import APIRouter, Depends, FastAPI, Request, WebSocket
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool
from starlette.routing import BaseRoute, Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cosy.errors import Unauthorized, Unavailable
from cosy.frontend.api_routing import add_route, api_router, error_response, log
from cosy.frontend.auth import KeyGate
from cosy.frontend.lexicon_api import build_lexicon_router
from cosy.frontend.metrics import Metrics
from cosy.frontend.openai_api import build_openai_router
from cosy.frontend.pai_api import build_pai_router
from cosy.frontend.reference_audio import ReferenceAudios
from cosy.frontend.service import FrontendService
from cosy.frontend.speech_batch import build_batch_router
from cosy.frontend.voices_api import build_voices_router
from cosy.frontend.ws_openai import OpenAIDialect, OpenAISession
from cosy.frontend.ws_params import DashScopeDialect, Dialect
from cosy.frontend.ws_tasks import MAX_MESSAGE_BYTES, TaskSession

Ready = Callable[[], tuple[bool, str]]
# a speech request's JSON: the same bound as one WebSocket message (20,000 characters of text at 12 bytes each,
# JSON-escaped, fit with room to spare); the reference-audio upload (multipart) has its own limit
MAX_BODY_BYTES = MAX_MESSAGE_BYTES


def bearer_auth(api_key: str) -> Callable:
    """A dependency: the request must carry the key (constant-time comparison)."""
    expected = api_key.encode()

    async def check(request: Request) -> None:
        header = request.headers.get("authorization", "").strip()
        scheme, _, rest = header.partition(" ")
        token = rest.strip() if scheme.lower() == "bearer" else header
        if not token:
            raise Unauthorized("this API needs a key: send the header 'Authorization: Bearer <key>' "
                               "(the key the frontend was started with, --api_key)")
        if not hmac.compare_digest(token.encode(), expected):
            raise Unauthorized("wrong API key: send the key the frontend was started with (--api_key)")

    return check


def build_router(service: FrontendService, *, api_key: str | None, ready: Ready) -> APIRouter:
    """Every API route of a frontend (auth included); `install` also adds the 404 handling."""
    metrics = service.metrics
    refs = ReferenceAudios(service)
    auth = [Depends(bearer_auth(api_key))] if api_key else []
    router = api_router()
    router.include_router(build_pai_router(service, refs, auth))
    router.include_router(build_openai_router(service, refs, auth))
    router.include_router(build_lexicon_router(service, auth))  # /api/v1/lexicon (cosy.frontend.lexicon_api)
    router.include_router(build_voices_router(service, auth))  # /v1/audio/voices (cosy.frontend.voices_api)
    router.include_router(build_batch_router(service, auth))  # /v1/audio/speech/batch (cosy.frontend.speech_batch)

    async def pai_ws(ws: WebSocket):
        await TaskSession(ws, service, refs, Dialect()).serve()

    async def dashscope_ws(ws: WebSocket):
        await TaskSession(ws, service, refs, DashScopeDialect()).serve()

    async def openai_ws(ws: WebSocket):
        await OpenAISession(ws, service, refs, OpenAIDialect(service.sample_rate)).serve()

    # WebSockets: the key is checked by KeyGate (close code 1008 without it)
    router.add_api_websocket_route("/api-ws/v1/audio/speech", pai_ws)
    router.add_api_websocket_route("/api-ws/v1/inference", dashscope_ws)
    router.add_api_websocket_route("/api-ws/v1/inference/", dashscope_ws)
    router.add_api_websocket_route("/v1/audio/speech/stream", openai_ws)

    async def health():
        """The process is up (no key needed)."""
        return {"status": "ok"}

    async def readiness():
        """Models loaded and the LM backend reachable, else 503 (no key needed). The answer says only
        ready / not ready; why not (which backend, which host) goes to the log."""
        start = time.monotonic()
        try:
            ok, reason = await run_in_threadpool(ready)
        except Exception as e:  # a failing check is an answer too
            ok, reason = False, f"the readiness check failed: {type(e).__name__}: {e}"
        metrics.ready_check.observe(time.monotonic() - start)
        if not ok:
            log.warning("/ready: not ready: %s", reason)
            raise Unavailable("not ready (the frontend's log says why)")
        return {"status": "ready"}

    async def prometheus():
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    add_route(router, "GET", "/health", health, tags=["ops"])
    add_route(router, "GET", "/ready", readiness, tags=["ops"])
    add_route(router, "GET", "/metrics", prometheus, tags=["ops"], dependencies=auth)
    return router


def _served(routes: list[BaseRoute], scope: Scope, skip: set[int]) -> bool:
    """Does a route other than ours serve this path (any method)? A root mount is looked into."""
    for route in routes:
        if id(route) in skip:
            continue
        match, child = route.matches(scope)
        if match is Match.NONE:
            continue
        if isinstance(route, Mount) and route.path == "":
            inner = getattr(route.app, "routes", None)
            if inner is None or _served(inner, {**scope, **child}, skip):
                return True  # an app we cannot look into claims everything
            continue
        return True
    return False


class ApiGate:
    """ASGI middleware before routing: counts API requests; 404/405 in our shape for paths nobody serves."""

    def __init__(self, app: ASGIApp, *, outer: FastAPI, api_routes: list[BaseRoute], metrics: Metrics):
        self.app, self.outer, self.api_routes, self.metrics = app, outer, api_routes, metrics
        self._ours = {id(r) for r in api_routes}
        self.listing = sorted({f"{m} {r.path.rstrip('/') or '/'}" for r in api_routes
                               for m in (getattr(r, "methods", None) or ()) if m != "HEAD"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        partial = None
        for route in self.api_routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                path = route.path.rstrip("/") or "/"
                if _json_body(scope):
                    receive = await _bounded_body(scope, receive, send, MAX_BODY_BYTES)
                    if receive is None:
                        self.metrics.answered(path, scope["method"], 413)
                        return
                return await self._counted(path, scope, receive, send)
            if match is Match.PARTIAL:
                partial = partial or route
        if _served(self.outer.router.routes, scope, self._ours):
            return await self.app(scope, receive, send)
        method, path = scope["method"], scope["path"]
        if partial is not None:
            allowed = sorted({m for r in self.api_routes if r.path.rstrip("/") == partial.path.rstrip("/")
                              for m in (getattr(r, "methods", None) or ()) if m != "HEAD"})
            response = error_response(f"{method} is not allowed on {path}: use {', '.join(allowed)}", 405,
                                      headers={"Allow": ", ".join(allowed)}, echoed=(path,))
        else:
            response = error_response(
                f"no route {method} {path} on this cosy frontend; its HTTP API routes are listed in 'routes' "
                "(the WebUI is at /)", 404, routes=self.listing, echoed=(path,))
        self.metrics.answered("unmatched", method, response.status_code)
        await response(scope, receive, send)

    async def _counted(self, route: str, scope: Scope, receive: Receive, send: Send) -> None:
        status = 500  # if the app fails before answering

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            self.metrics.answered(route, scope["method"], status)


def _json_body(scope: Scope) -> bool:
    """A request that may carry a body other than a multipart upload."""
    if scope["method"] in ("GET", "HEAD", "DELETE", "OPTIONS"):
        return False
    content_type = next((v for k, v in scope["headers"] if k == b"content-type"), b"")
    return not content_type.lower().startswith(b"multipart/")


async def _bounded_body(scope: Scope, receive: Receive, send: Send, limit: int) -> Receive | None:
    """A `receive` that replays the request's body, read here up to `limit` bytes; None once a 413 was
    answered instead (by its Content-Length at once, else when the body passed the limit)."""
    mib = f"{limit / 2**20:g} MiB"
    length = next((v for k, v in scope["headers"] if k == b"content-length"), b"")
    if length.isdigit() and int(length) > limit:
        response = error_response(f"the request body is {int(length)} bytes; at most {mib} (a speech request's "
                                  "JSON: 20,000 characters of text fit)", 413)
        await response(scope, receive, send)
        return None
    messages, size = [], 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":  # the client left: the route sees it as it would have
            break
        size += len(message.get("body", b""))
        if size > limit:
            response = error_response(f"the request body is larger than {mib} (a speech request's JSON: 20,000 "
                                      "characters of text fit)", 413)
            await response(scope, receive, send)
            return None
        if not message.get("more_body", False):
            break

    async def replay() -> Message:
        return messages.pop(0) if messages else await receive()

    return replay


def install(app: FastAPI, service: FrontendService, *, api_key: str | None, ready: Ready) -> Metrics:
    """Add the API routes (call before mounting Gradio), the 404/405 handling and the request metrics."""
    metrics = service.metrics
    before = {id(r) for r in app.router.routes}
    app.include_router(build_router(service, api_key=api_key, ready=ready))
    ours = [r for r in app.router.routes if id(r) not in before]
    app.add_middleware(ApiGate, outer=app, api_routes=ours, metrics=metrics)
    if api_key:  # added last, so it runs first: the key guards every route of the app, Gradio's too
        app.add_middleware(KeyGate, api_key=api_key)
    return metrics
