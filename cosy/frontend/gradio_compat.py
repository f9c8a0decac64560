"""Raw gradio calls written before an endpoint gained a parameter keep working.

gradio_client fills a new trailing parameter's default itself, but a raw `POST /gradio_api/call/NAME` with
the old number of `data` values is refused by gradio ("didn't receive enough input values"). The parameters
named in ADDED_LATER were added with a default after their endpoints were published (`enable_ssml`, `hot_fix`,
`language_hints`, `enable_markdown_filter`); this
middleware appends their defaults to such a call's `data`, so `{"data": ["你好", "alice", 0, 1.0]}` to
`/saved_voice` still speaks. Fewer values than that stay an error, as before.
"""
from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable

ADDED_LATER = ("enable_ssml", "hot_fix", "language_hints", "enable_markdown_filter")
_CALL = re.compile(r"/gradio_api/call/([\w-]+)")
_MAX_BODY = 1 << 20  # a raw call's JSON (files travel as uploads, by path)
# api_name -> (all parameters, defaults of the trailing ones added later)
_PADDING: dict[str, tuple[int, list]] = {}


def note(fn: Callable, api_name: str) -> None:
    """Record `fn`'s trailing parameters that ADDED_LATER names (gradio's `request` is not a value)."""
    params = [p for p in inspect.signature(fn).parameters.values() if p.name != "request"]
    later = [p.default for p in params if p.name in ADDED_LATER]
    if later:
        _PADDING[api_name] = (len(params), later)


def padded(api_name: str, body: bytes) -> bytes:
    """The call's body with the missing later parameters' defaults appended (else as it came)."""
    try:
        obj = json.loads(body)
        data = obj["data"]
    except (ValueError, TypeError, KeyError, RecursionError):  # gradio answers it (400)
        return body
    full, later = _PADDING[api_name]
    missing = full - len(data) if isinstance(data, list) else 0
    if not 0 < missing <= len(later):
        return body
    obj["data"] = data + later[len(later) - missing:]
    return json.dumps(obj).encode()


class PadRawCalls:
    """ASGI middleware: `padded` for raw calls of the endpoints `note` recorded."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        m = _CALL.fullmatch(scope.get("path", "")) if scope["type"] == "http" and scope["method"] == "POST" else None
        if m is None or m[1] not in _PADDING:
            return await self.app(scope, receive, send)
        body, more = b"", True
        while more and len(body) <= _MAX_BODY:
            message = await receive()
            if message["type"] != "http.request":  # the client left: gradio sees it the same way
                return await self.app(scope, _replay([message], receive), send)
            body += message.get("body", b"")
            more = message.get("more_body", False)
        if more:  # too large to be a call of ours: passed on untouched
            return await self.app(scope, _replay([{"type": "http.request", "body": body, "more_body": True}],
                                                 receive), send)
        body = padded(m[1], body)
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
        scope = {**scope, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
        return await self.app(scope, _replay([{"type": "http.request", "body": body, "more_body": False}],
                                             receive), send)


def _replay(messages: list[dict], then):
    """A `receive` that gives `messages` first, then the original's."""
    queue = list(messages)

    async def receive():
        if queue:
            return queue.pop(0)
        return await then()
    return receive
