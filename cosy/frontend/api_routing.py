"""How every route of the frontend's HTTP APIs answers. One error shape (OpenAI's, used by the PAI routes too):

    {"error": {"message": "speed 10 is out of range (0.5 to 2.0)", "type": "invalid_request_error", "code": 400}}

`type` is one of invalid_request_error, unauthorized, not_found, rate_limited, unavailable, server_error.
429 and 503 answers carry a Retry-After header. `ApiRoute` makes every route of a router answer in this
shape, whatever goes wrong in it (CosyError, bad JSON or fields, an unexpected exception: a 500 with
no stack trace). `add_route` also registers the path with a trailing slash (PAI clients send both; with
Gradio mounted at "/" a redirect would never happen, as the mount matches every path).
"""
from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable

from fastapi import APIRouter
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException  # FastAPI's is a subclass: both are caught
from starlette.requests import Request
from starlette.responses import Response

from cosy.errors import CosyError, error_type, public_message

log = logging.getLogger(__name__)
DEFAULT_RETRY_AFTER = 5.0


def sse(obj: dict) -> str:
    """One server-sent event: `data: <json>` and a blank line (non-ASCII text kept as is)."""
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def error_body(message: str, status: int, echoed: tuple[str, ...] = (), **extra) -> dict:
    """The JSON error shape of every HTTP answer and SSE error event; the message as a client may see it
    (`cosy.errors.public_message`: no backend address, no server path; `echoed`: the client's own words)."""
    return {"error": {"message": public_message(message, echoed), "type": error_type(status), "code": status,
                      **extra}}


def error_response(message: str, status: int, retry_after: float | None = None,
                   headers: dict[str, str] | None = None, echoed: tuple[str, ...] = (), **extra) -> JSONResponse:
    """A JSON error answer; 429/503 get Retry-After (whole seconds, at least 1)."""
    headers = dict(headers or {})
    if status in (429, 503):
        headers["Retry-After"] = str(max(1, math.ceil(retry_after if retry_after else DEFAULT_RETRY_AFTER)))
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(error_body(message, status, echoed, **extra), status_code=status, headers=headers)


def from_cosy_error(e: CosyError) -> JSONResponse:
    """The answer for a CosyError: its status; a 5xx message is logged in full and answered without
    URLs or server paths (`cosy.errors.public_message`)."""
    if e.status >= 500:
        log.warning("answering %d: %s", e.status, e)
    return error_response(str(e), e.status, e.retry_after)


def describe_validation(errors: list[dict]) -> str:
    """FastAPI/pydantic errors -> one readable sentence naming the fields (without the 'body.' prefix)."""
    parts = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path")]
        where = ".".join(loc) if loc else "request body"
        msg = err.get("msg", "invalid")
        if err.get("type") == "json_invalid":
            where, msg = "request body", "is not valid JSON"
        parts.append(f"{where}: {msg}")
    return "invalid request: " + "; ".join(parts)


class ApiRoute(APIRoute):
    """An APIRoute whose failures all become the JSON error shape above."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def guarded(request: Request) -> Response:
            try:
                return await handler(request)
            except CosyError as e:
                return from_cosy_error(e)
            except RequestValidationError as e:
                return error_response(describe_validation(list(e.errors())), 400)
            except HTTPException as e:  # Starlette's: a malformed multipart body, a body that is not JSON
                detail = e.detail if isinstance(e.detail, str) else json.dumps(e.detail)
                if e.status_code == 400:
                    detail = f"malformed request body: {detail}"
                return error_response(detail, e.status_code)
            except RecursionError:  # e.g. JSON nested 100,000 deep
                return error_response("malformed request body: nested too deeply", 400)
            except Exception:
                log.exception("%s %s failed", request.method, request.url.path)
                return error_response("internal error (the frontend's log has the details)", 500)

        return guarded


def api_router(**kw) -> APIRouter:
    return APIRouter(route_class=ApiRoute, **kw)


def add_route(router: APIRouter, method: str, path: str, endpoint: Callable, **kw) -> None:
    """`path` and `path/` (the latter left out of the OpenAPI schema)."""
    router.add_api_route(path, endpoint, methods=[method], **kw)
    router.add_api_route(path + "/", endpoint, methods=[method], include_in_schema=False, **kw)
