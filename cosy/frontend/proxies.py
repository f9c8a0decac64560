"""Which client a request comes from when proxies stand in front of the frontend (`--trusted_proxies`).

Behind a proxy every connection comes from the proxy's address; the proxy names the client in
`X-Forwarded-For` (HAProxy: `option forwardfor`, appending a header line of its own). Any client can send that
header too, so it counts only on a connection from a configured proxy:

    uvicorn.Config(ForwardedFor(app, trusted=parse_trusted_proxies("10.0.0.5,10.1.0.0/16")), proxy_headers=False)

Then the client is the rightmost address of the header (every line, in order) that is not itself a trusted
proxy: addresses to its left were written by the client and are not believed. The ASGI scope's `client` (and
`scheme`, from `X-Forwarded-Proto`) is replaced, so every part of the app (the wrong-key limit of
cosy.frontend.auth, logs) sees the same client. Without trusted proxies the headers change nothing: uvicorn's
own handling, which trusts 127.0.0.1 by default, stays off.
"""
from __future__ import annotations

import ipaddress
from functools import lru_cache

from starlette.types import ASGIApp, Receive, Scope, Send

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_CLIENT_CHARS = 64  # a hop that is no address is kept as a name of at most this many characters


def parse_trusted_proxies(text: str | None) -> tuple[Network, ...]:
    """`--trusted_proxies`: comma-separated IP addresses and CIDR networks; empty or None: none."""
    out = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        try:
            out.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"--trusted_proxies: {item!r} is not an IP address or network (give addresses and "
                             "CIDR networks of the proxies in front of this frontend, e.g. 10.0.0.5,10.1.0.0/16)"
                             ) from None
    return tuple(out)


def _address(hop: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An `X-Forwarded-For` hop or a peer as an address (port and IPv6 brackets dropped, IPv4-mapped IPv6 as
    IPv4); None if it is none."""
    hop = hop.strip()
    if hop.startswith("["):
        hop = hop[1:].partition("]")[0]
    elif hop.count(":") == 1:  # IPv4 with a port
        hop = hop.partition(":")[0]
    try:
        ip = ipaddress.ip_address(hop)
    except ValueError:
        return None
    return ip.ipv4_mapped or ip if isinstance(ip, ipaddress.IPv6Address) else ip


class ForwardedFor:
    """ASGI middleware: the client named by a trusted proxy's `X-Forwarded-For` (module doc)."""

    def __init__(self, app: ASGIApp, *, trusted: tuple[Network, ...]):
        self.app = app
        self.trusted = tuple(trusted)
        self._cached = lru_cache(maxsize=4096)(self._is_trusted)

    def _trusts(self, host: str) -> bool:
        return len(host) <= MAX_CLIENT_CHARS and self._cached(host)  # no address is longer: not cached

    def _is_trusted(self, host: str) -> bool:
        ip = _address(host)
        return ip is not None and any(ip in net for net in self.trusted if net.version == ip.version)

    def client(self, forwarded_for: list[bytes]) -> str | None:
        """The client named by a trusted proxy's `X-Forwarded-For` lines; None if they name none."""
        hops = [h.strip() for line in forwarded_for for h in line.decode("latin-1").split(",")]
        hops = [h for h in hops if h]
        for hop in reversed(hops):
            if not self._trusts(hop):
                return _normal(hop)
        return _normal(hops[0]) if hops else None  # every hop a proxy: the first is the client

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        peer = scope.get("client")
        if scope["type"] in ("http", "websocket") and peer and self.trusted and self._trusts(peer[0]):
            headers = scope.get("headers", ())
            client = self.client([v for k, v in headers if k.lower() == b"x-forwarded-for"])
            protos = [v for k, v in headers if k.lower() == b"x-forwarded-proto"]
            scope = dict(scope)
            if client is not None:
                scope["client"] = (client, 0)
            if protos:
                proto = protos[-1].decode("latin-1").split(",")[-1].strip().lower()
                if proto in ("http", "https"):
                    scope["scheme"] = proto.replace("http", "ws") if scope["type"] == "websocket" else proto
        await self.app(scope, receive, send)


def _normal(hop: str) -> str:
    ip = _address(hop)
    return str(ip) if ip is not None else hop[:MAX_CLIENT_CHARS]
