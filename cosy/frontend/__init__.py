"""Frontends of one cosy instance: the service every surface calls (`service`), the Gradio WebUI (`webui`),
the gradio_client API (`gradio_api`) and the process that serves them (`server`, run by app.py)."""
from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> None:
    """app.py and the `cosy-frontend` command (`cosy.frontend.server.main`). The server is imported here,
    not at the top: each synthesis worker is a spawned process that imports its parent's main script again
    (as __mp_main__), and through a top-level import it would load the whole server (Gradio, FastAPI, the
    APIs) for nothing (tests/test_import_graph.py holds it; bench/startup.py measures a start)."""
    from cosy.frontend.server import main as serve

    serve(argv)
