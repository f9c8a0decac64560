"""Whether a host name stays on this machine: the one test behind the rules that tell a frontend and a
backend they share its cores (`--llm_split_first_chunk auto`, idle OpenMP threads asleep). Standard library
only: the backend's launcher uses it before vLLM starts."""
from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlparse

__all__ = ["all_on_this_machine", "is_loopback"]


def is_loopback(host: str) -> bool:
    """Every address `host` resolves to is a loopback one (False if it does not resolve)."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
        return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)
    except (OSError, ValueError):
        return False


def all_on_this_machine(base_urls: str) -> bool:
    """Every URL of the comma-separated list `base_urls` (at least one) names a loopback host."""
    urls = [u.strip() for u in base_urls.split(",") if u.strip()]
    return bool(urls) and all(is_loopback(urlparse(u).hostname or "") for u in urls)
