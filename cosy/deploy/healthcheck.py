"""The container HEALTHCHECK: exit 0 if this container's server answers GET /health with 200, else 1.

    python3 -m cosy.deploy.healthcheck [URL]

URL: the argument, else $COSY_HEALTH_URL, else /health on the default port of $COSY_ROLE (backend 8000,
frontend 50000) on the loopback. Standard library only: it runs every few seconds.
"""
from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

DEFAULT_PORTS = {"backend": 8000, "frontend": 50000}


def health_url(argv: list[str], env: dict[str, str]) -> str:
    if argv:
        return argv[0]
    if env.get("COSY_HEALTH_URL"):
        return env["COSY_HEALTH_URL"]
    port = DEFAULT_PORTS.get(env.get("COSY_ROLE", "frontend"), DEFAULT_PORTS["frontend"])
    return f"http://127.0.0.1:{port}/health"


def main(argv: list[str] | None = None) -> int:
    url = health_url(sys.argv[1:] if argv is None else argv, dict(os.environ))
    try:
        with urllib.request.urlopen(url, timeout=4) as r:
            return 0 if r.status == 200 else 1
    except (OSError, urllib.error.URLError) as e:
        print(f"unhealthy: {url}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
