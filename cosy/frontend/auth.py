"""One key for every surface of a frontend started with `--api_key`: an ASGI middleware in front of
everything (HTTP APIs, the gradio_client API, Gradio's upload/file/queue routes, the WebUI, WebSockets).

    app.add_middleware(KeyGate, api_key=key)      # added last: it runs first

A request is let in with any of
* `Authorization: Bearer KEY` (or the bare key, as PAI-EAS clients send it);
* `X-HF-Authorization: Bearer KEY`: gradio_client moves an `Authorization` header there, so
  `Client(url, headers={"Authorization": "Bearer KEY"})` works;
* the session cookie `cosy_session` that `POST /login` (form fields `password` = the key, `username`
  ignored) sets: the WebUI's login page posts there, and so does `Client(url, auth=("any", KEY))`.
  The cookie holds an HMAC of the key, never the key.
Open without the key: `GET /health`, `GET /ready` (which says only ready / not ready) and the login itself.
Everything else without a valid key: 401 in the APIs' JSON error shape; a browser's GET of the page
(`/`) gets the login page (status 401) instead of the app; a WebSocket is closed with code 1008.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import math
import time
from collections import deque
from urllib.parse import parse_qs

from starlette.types import ASGIApp, Receive, Scope, Send

from cosy.frontend.api_routing import error_response

COOKIE = "cosy_session"
OPEN_PATHS = frozenset({"/health", "/health/", "/ready", "/ready/"})
LOGIN_PATHS = frozenset({"/login", "/login/"})
PAGE_PATHS = frozenset({"", "/"}) | LOGIN_PATHS  # where a browser gets the login page
MAX_LOGIN_BODY = 16 * 1024

LOGIN_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>cosy · login</title>
<style>body{font-family:system-ui,sans-serif;display:flex;justify-content:center;margin-top:15vh}
form{display:flex;flex-direction:column;gap:.7em;width:20em}input,button{font-size:1em;padding:.5em}
#msg{color:#b00}</style></head>
<body><form id="login" method="post" action="login">
<h2>CosyVoice2 · cosy</h2>
<label for="password">API key 访问密钥 (the frontend's --api_key)</label>
<input type="hidden" name="username" value="webui">
<input id="password" name="password" type="password" autocomplete="current-password" required autofocus>
<button type="submit" id="login_button">登录 Log in</button><div id="msg"></div></form>
<script>
document.getElementById("login").addEventListener("submit", async (e) => {
  e.preventDefault();
  const r = await fetch("login", {method: "POST", body: new URLSearchParams(new FormData(e.target))});
  if (r.ok) { location.reload(); } else { document.getElementById("msg").textContent = "wrong key 密钥错误"; }
});
</script></body></html>
"""


def session_token(api_key: str) -> str:
    """The cookie value for `api_key` (stable across restarts and frontends sharing the key)."""
    return hmac.new(api_key.encode(), b"cosy-webui-session", hashlib.sha256).hexdigest()


def _bearer(value: str) -> str:
    scheme, _, rest = value.strip().partition(" ")
    return rest.strip() if scheme.lower() == "bearer" else value.strip()


def _json_password(body: bytes) -> str | None:
    """The password (or key) of a JSON login body; None when the body is malformed: not JSON, not an object,
    nested too deeply for the parser (RecursionError, within the 16 KiB), or a password that is no string."""
    try:
        fields = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(fields, dict):
        return None
    password = fields.get("password") or fields.get("key") or ""
    return password if isinstance(password, str) else None


def _form_password(body: bytes) -> str:
    """The password (or key) of a form-encoded login body (undecodable bytes replaced)."""
    fields = parse_qs(body.decode("utf-8", "replace"))
    return (fields.get("password") or fields.get("key") or [""])[0]


def _cookies(header: str) -> dict[str, str]:
    out = {}
    for part in header.split(";"):
        name, sep, value = part.strip().partition("=")
        if sep:
            out[name] = value
    return out


class FailedAttempts:
    """Wrong keys per client address in a sliding window: past `limit` in `window` s, that address gets 429
    (Retry-After: until its oldest failure leaves the window), the right key included (else guessing goes on);
    other addresses are not affected. At most `max_clients` addresses are remembered (the oldest go)."""

    def __init__(self, limit: int = 30, window: float = 60.0, max_clients: int = 10_000):
        self.limit, self.window, self.max_clients = limit, window, max_clients
        self._failures: dict[str, deque[float]] = {}

    def _recent(self, client: str, now: float) -> deque[float]:
        times = self._failures.get(client, deque())
        while times and times[0] <= now - self.window:
            times.popleft()
        return times

    def retry_after(self, client: str) -> float | None:
        """Seconds until `client` may try again; None if it may now."""
        now = time.monotonic()
        times = self._recent(client, now)
        if not times:
            self._failures.pop(client, None)
        return times[0] + self.window - now if len(times) >= self.limit else None

    def failed(self, client: str) -> None:
        now = time.monotonic()
        times = self._recent(client, now)
        times.append(now)
        self._failures.pop(client, None)
        self._failures[client] = times  # most recent last
        while len(self._failures) > self.max_clients:
            self._failures.pop(next(iter(self._failures)))


def _client(scope: Scope) -> str:
    """The address the limit counts: the connection's, or the client a trusted proxy names (cosy.frontend.proxies,
    `--trusted_proxies`; a client's own X-Forwarded-For counts for nothing)."""
    client = scope.get("client")
    return client[0] if client else "?"


class KeyGate:
    """ASGI middleware: every request except OPEN_PATHS and the login must carry the key (see module doc)."""

    def __init__(self, app: ASGIApp, *, api_key: str):
        if not api_key:
            raise ValueError("KeyGate needs a key")
        self.app = app
        self._key = api_key.encode()
        self._token = session_token(api_key).encode()
        self.failures = FailedAttempts()

    def authorized(self, headers: dict[bytes, bytes]) -> bool:
        for name in (b"authorization", b"x-hf-authorization"):
            if name in headers:
                token = _bearer(headers[name].decode("latin-1"))
                if token and hmac.compare_digest(token.encode("latin-1"), self._key):
                    return True
        cookie = _cookies(headers.get(b"cookie", b"").decode("latin-1")).get(COOKIE)
        return bool(cookie) and hmac.compare_digest(cookie.encode("latin-1"), self._token)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if scope["type"] == "http" and path in OPEN_PATHS:
            return await self.app(scope, receive, send)
        headers: dict[bytes, bytes] = {}
        for k, v in scope.get("headers", ()):
            headers.setdefault(k.lower(), v)
        presented = any(_bearer(headers.get(n, b"").decode("latin-1"))
                        for n in (b"authorization", b"x-hf-authorization"))
        login = scope["type"] == "http" and path in LOGIN_PATHS and scope["method"] == "POST"
        if login or presented:  # a key guess: refused while this address has failed too often
            wait = self.failures.retry_after(_client(scope))
            if wait is not None:
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008, "reason": "too many wrong API keys"})
                    return
                response = error_response(f"too many wrong API keys from this address: try again in "
                                          f"{math.ceil(wait)} s", 429, retry_after=wait)
                return await response(scope, receive, send)
        if login:
            return await self._login(scope, receive, send)
        if self.authorized(headers):
            return await self.app(scope, receive, send)
        if presented:
            self.failures.failed(_client(scope))
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008, "reason": "this frontend needs its API key"})
            return
        if scope["method"] in ("GET", "HEAD") and path in PAGE_PATHS:
            from starlette.responses import HTMLResponse
            response = HTMLResponse(LOGIN_PAGE, status_code=401, headers={"WWW-Authenticate": "Bearer"})
        elif presented:
            response = error_response("wrong API key: send the key the frontend was started with (--api_key)", 401)
        else:
            response = error_response(
                "this frontend needs its API key: send 'Authorization: Bearer <key>' (the key it was started "
                "with, --api_key), or log in at / (WebUI, gradio_client auth=(user, key))", 401)
        await response(scope, receive, send)

    async def _login(self, scope: Scope, receive: Receive, send: Send) -> None:
        body, more = b"", True
        while more and len(body) <= MAX_LOGIN_BODY:
            message = await receive()
            if message["type"] != "http.request":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if len(body) > MAX_LOGIN_BODY:
            response = error_response(f"the login body is over {MAX_LOGIN_BODY // 1024} KiB: send only the "
                                      "field password (a form, or JSON {\"password\": KEY})", 413)
            return await response(scope, receive, send)
        ctype = dict((k.lower(), v) for k, v in scope.get("headers", ())).get(b"content-type", b"")
        password = _json_password(body) if ctype.startswith(b"application/json") else _form_password(body)
        if password is None:
            response = error_response("the login body is not a JSON object with a string password: send "
                                      "{\"password\": KEY}, or the form field password", 400)
            return await response(scope, receive, send)
        if password and hmac.compare_digest(password.encode("utf-8", "replace"), self._key):
            from starlette.responses import JSONResponse
            response = JSONResponse({"success": True})
            response.set_cookie(COOKIE, self._token.decode(), httponly=True, samesite="lax", path="/")
        else:
            self.failures.failed(_client(scope))
            response = error_response("wrong API key: log in with the key the frontend was started with (--api_key)",
                                      401)
        await response(scope, receive, send)
