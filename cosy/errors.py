"""The errors every layer raises, each carrying the HTTP status it maps to (one definition of that mapping).

    raise NotFound("unknown voice 'alice'")          # -> 404 on every surface
    raise Busy("retry later", retry_after=3.0)        # -> 429 with Retry-After

A surface never inspects a message to choose a status: it reads `status` (and `retry_after`). Errors with
status < 500 are the caller's to fix (their message says how); 5xx are ours or a dependency's. The
domain errors (`SynthesisError`, `AudioError`, `VoiceError`, `BackendError`, ...) subclass these, and an
error that crossed the worker-process hop comes back as `JobError` with the same status and message.
"""
from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

# what an answer must never show: a backend's URL (or host:port), a server path
# (a scheme starts only where no scheme character precedes it: one scan per run, linear in any text)
_URL = re.compile(r"(?<![a-zA-Z0-9+.-])[a-zA-Z][a-zA-Z0-9+.-]*+://[^\s'\"<>)\],;]+")
_HOST_PORT = re.compile(r"\b(?:\d{1,3}(?:\.\d{1,3}){3}|localhost|\[[0-9a-fA-F:]+\]):\d{1,5}\b")
_PROMPT_FILE = re.compile(r"prompt audio file '[^']*'")
_PATH = re.compile(r"(?<![\w.:/])/(?:[^\s'\"/<>]+/)+[^\s'\"/<>]*")
# our own HTTP routes, which messages name to tell a client what to call: not server paths
_ROUTE = re.compile(r"/(?:api|api-ws|v1|gradio_api)/")


class CosyError(Exception):
    """Base class; `status` is the class default unless given, `retry_after` is seconds (429/503) or None."""

    status = 500

    def __init__(self, message: str = "", status: int | None = None, retry_after: float | None = None):
        super().__init__(message or (type(self).__doc__ or type(self).__name__).strip().split("\n")[0])
        if status is not None:
            self.status = status
        self.retry_after = retry_after

    @property
    def message(self) -> str:
        return str(self)


class BadRequest(CosyError, ValueError):
    """The request cannot be served as sent (400); the message names the field and what is allowed."""

    status = 400


class Unauthorized(CosyError):
    status = 401


class NotFound(BadRequest):
    status = 404


class Conflict(BadRequest):
    status = 409


class PayloadTooLarge(BadRequest):
    status = 413


class UnsupportedMedia(BadRequest):
    status = 415


class Unprocessable(BadRequest):
    """The request is well-formed, but this model cannot serve it as asked (422); the message says what to
    change (another seed, another mode) for it to be served."""

    status = 422


class Busy(CosyError):
    """Every slot and queue place is taken (429): retry after `retry_after` seconds."""

    status = 429


class Unavailable(CosyError):
    """A dependency (the LM backend, a worker) cannot serve now (503)."""

    status = 503


class InsufficientStorage(CosyError):
    """The data dir's filesystem is full (507): nothing was stored; free space there, or raise its quota."""

    status = 507


class Cancelled(CosyError):
    """The caller went away (or cancelled): the job was dropped; 499 as nginx says "client closed request"."""

    status = 499


class JobError(CosyError):
    """A job failed in a worker process: the original error's class name (`kind`), message and status."""

    def __init__(self, kind: str, message: str, status: int = 500, retry_after: float | None = None):
        super().__init__(message, status, retry_after)
        self.kind = kind

    @classmethod
    def wire(cls, e: BaseException) -> tuple[str, str, int, float | None]:
        """What the worker sends for `e` (plain values): a non-cosy exception is a 500."""
        if isinstance(e, CosyError):
            return type(e).__name__, str(e), e.status, e.retry_after
        return type(e).__name__, f"{type(e).__name__}: {e}", 500, None


@contextmanager
def storing(what: str) -> Iterator[None]:
    """Map the filesystem's refusals while storing `what` (e.g. "the upload") to errors that say so: a full
    disk or quota 507, a read-only or unwritable data dir 503; other OSErrors pass (500: ours)."""
    try:
        yield
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise InsufficientStorage(f"no space left on the data dir's filesystem: {what} was not stored "
                                      "(free space there, or raise its quota)") from None
        if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise Unavailable(f"the data dir is not writable ({os.strerror(e.errno)}): {what} was not stored",
                              retry_after=30.0) from None
        raise


ECHO_CHARS = 80  # of a client's value quoted in an error message


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """At most `limit` characters of `text` (a client's value in a message), cut with an ellipsis."""
    return text[:limit] + "…" if len(text) > limit else text


def echo(value: object, limit: int = ECHO_CHARS) -> str:
    """A client's value quoted in an error message (its repr), at most `limit` characters of it: a message
    names what was wrong without sending a large input back."""
    return repr(clip(value if isinstance(value, str) else str(value), limit))


def public_message(message: str, echoed: tuple[str, ...] = ()) -> str:
    """`message` as a client may see it: without URLs and host:port (a backend's address: the log has it)
    and without server paths (an uploaded file's place in the data dir). `echoed`: the client's own words
    in it (the path it asked for), kept as they are."""
    for text in echoed:
        if text and text in message:
            return text.join(public_message(part) for part in message.split(text))
    message = _URL.sub("<backend>", message)
    message = _HOST_PORT.sub("<backend>", message)
    message = _PROMPT_FILE.sub("the prompt audio", message)
    return _PATH.sub(lambda m: m[0] if _ROUTE.match(m[0]) else "<file>", message)


def error_type(status: int) -> str:
    """The `type` of the JSON error shape (OpenAI's) for an HTTP status."""
    if status == 401:
        return "unauthorized"
    if status == 404:
        return "not_found"
    if status == 429:
        return "rate_limited"
    if status == 499:  # the client went away (nginx's "client closed request")
        return "cancelled"
    if status in (502, 503, 504):
        return "unavailable"
    if status == 507:
        return "insufficient_storage"
    return "server_error" if status >= 500 else "invalid_request_error"
