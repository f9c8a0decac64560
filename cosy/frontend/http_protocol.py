"""uvicorn's HTTP protocol with a deadline for each request's head (slowloris).

uvicorn times out idle keep-alive connections, but not one that sends half a request line and then nothing:
50 such connections stayed open for as long as their clients liked, each holding a socket and a place in
`--limit_concurrency`-style bounds. Here a connection must send a whole request line and its headers within
HEADER_TIMEOUT seconds of opening, or of starting its next request; otherwise it is closed. (Bodies and
responses are not timed here: an upload may be slow, a synthesis stream long.)

    uvicorn.Config(app, http=HeaderTimeoutProtocol.with_timeout(30.0))   # app.py --header_timeout
"""
from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

HEADER_TIMEOUT = 30.0  # seconds for a request line and headers; HAProxy's `timeout http-request` is the same


class HeaderTimeoutProtocol(HttpToolsProtocol):
    header_timeout = HEADER_TIMEOUT

    @classmethod
    def with_timeout(cls, seconds: float) -> type["HeaderTimeoutProtocol"]:
        """The protocol class (uvicorn takes a class) with a deadline of `seconds`."""
        return type(cls.__name__, (cls,), {"header_timeout": float(seconds)})

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_timer: asyncio.TimerHandle | None = None
        self._arm()

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()  # a pipelined or keep-alive request: its own deadline

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
