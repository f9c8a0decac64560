"""An HAProxy configuration for many frontends behind one address.

    python -m cosy.deploy.haproxy --bind 0.0.0.0:8080 --frontend 10.0.0.11:7860 --frontend 10.0.0.12:7860 \
        > /etc/haproxy/haproxy.cfg

Why HAProxy (Debian's `haproxy` package) rather than nginx: open-source nginx has no active health checks
(only passive `max_fails`), so a frontend that is up but not ready (model loading, backend unreachable) would
still get traffic; HAProxy polls `GET /ready` and takes a frontend out after two failures. HAProxy also streams
responses without buffering by default (SSE, chunked audio) and passes WebSocket upgrades in HTTP mode, where
nginx needs `proxy_buffering off` and upgrade headers per location.

Affinity: the HTTP APIs are stateless (uploads and saved voices live in the shared data dir), but a Gradio
session's queue lives in one process: its `queue/join` and `queue/data` must reach the same frontend. HAProxy
inserts a cookie on the first response; browsers and `gradio_client` (which keeps the cookies of its first
`/config` request) send it back. Clients without the cookie are balanced by least connections.

Client addresses: HAProxy appends the client's address to `X-Forwarded-For` (`option forwardfor`); a frontend
believes it only from the addresses in its `--trusted_proxies`, so start the frontends with this proxy's
address there (as seen by them), or every client shares the proxy's one address (and its wrong-key limit).
"""
from __future__ import annotations

import argparse
import sys

CHECK_INTERVAL_S = 2  # /ready poll period; a frontend leaves after 2 failed checks and returns after 2 good ones
# how long a /ready answer may take: a frontend busy with many streams answers late but is serving (HAProxy's
# default, the interval, took both frontends of the load test out at once); a dead one refuses at once
CHECK_TIMEOUT_S = 10
AFFINITY_COOKIE = "COSY_FRONTEND"
SERVER_HEADER = "X-Cosy-Frontend"  # names the frontend that answered (logs, debugging, tests)


def render(bind: str, frontends: list[str], *, check_interval_s: float = CHECK_INTERVAL_S,
           check_timeout_s: float = CHECK_TIMEOUT_S, stream_timeout_s: int = 600,
           stats_socket: str | None = None, dns: bool = False) -> str:
    """The haproxy.cfg text: `bind` HOST:PORT, `frontends` HOST:PORT each (at least one). `stats_socket`: a
    Unix socket path for HAProxy's runtime API (read-only: `echo "show stat" | socat stdio PATH` lists each
    frontend's UP/DOWN state). `dns`: frontends are names that the system resolver (/etc/resolv.conf: a
    compose network's or a Kubernetes cluster's DNS) resolves again while running, so a frontend container
    replaced at a new address is found again, and one not resolvable yet does not stop HAProxy's start."""
    if check_interval_s <= 0 or check_timeout_s <= 0:
        raise ValueError("the check interval and timeout must be positive seconds")
    if not frontends:
        raise ValueError("at least one --frontend HOST:PORT is needed")
    for addr in (bind, *frontends):
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"not HOST:PORT: {addr!r}")
    resolve = " resolvers sysdns init-addr last,libc,none" if dns else ""
    servers = "\n".join(f"    server fe{i} {addr} check cookie fe{i}{resolve}" for i, addr in enumerate(frontends, 1))
    resolvers = "\nresolvers sysdns\n    parse-resolv-conf\n    hold valid 5s\n    hold nx 5s\n" if dns else ""
    inter = f"{int(check_interval_s * 1000)}ms"
    stats = f"\n    stats socket {stats_socket} mode 600 level user" if stats_socket else ""
    return f"""\
# cosy: {len(frontends)} frontend(s) behind {bind}. Written by `python -m cosy.deploy.haproxy`.
global
    maxconn 4096{stats}

defaults
    mode http
    # the client's address, for the frontends' per-client limits: start them with --trusted_proxies=<the
    # address they see this proxy at>, or they ignore it
    option forwardfor
    # a frontend that refuses the connection (just died, not yet marked down): try another one
    option redispatch
    retries 2
    timeout connect 5s
    # a streamed synthesis may be silent for a while (first packet); WebSockets live long
    timeout client {stream_timeout_s}s
    timeout server {stream_timeout_s}s
    timeout tunnel 3600s
    timeout http-request 30s
    timeout check {int(check_timeout_s * 1000)}ms
{resolvers}
frontend cosy
    bind {bind}
    default_backend cosy_frontends

backend cosy_frontends
    balance leastconn
    option httpchk GET /ready
    http-check expect status 200
    default-server inter {inter} fall 2 rise 2
    cookie {AFFINITY_COOKIE} insert indirect nocache httponly
    http-response set-header {SERVER_HEADER} %s
{servers}
"""


def build_parser() -> argparse.ArgumentParser:
    """The config writer's flags (the docs' flags reference is generated from this parser)."""
    p = argparse.ArgumentParser(prog="python -m cosy.deploy.haproxy", description=__doc__.split("\n")[0])
    p.add_argument("--bind", default="0.0.0.0:8080", help="HOST:PORT the proxy listens on")
    p.add_argument("--frontend", action="append", default=[], metavar="HOST:PORT",
                   help="a cosy frontend (app.py); repeat for each")
    p.add_argument("--check_interval", type=float, default=CHECK_INTERVAL_S, help="seconds between /ready checks")
    p.add_argument("--check_timeout", type=float, default=CHECK_TIMEOUT_S,
                   help="seconds a /ready answer may take (a frontend under load answers late)")
    p.add_argument("--stats_socket", default=None, help="Unix socket path for HAProxy's read-only runtime API")
    p.add_argument("--dns", action="store_true",
                   help="frontends are DNS names (compose services, Kubernetes pods) resolved again while running")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        sys.stdout.write(render(args.bind, args.frontend, check_interval_s=args.check_interval,
                                check_timeout_s=args.check_timeout, stats_socket=args.stats_socket, dns=args.dns))
    except ValueError as e:
        p.error(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
