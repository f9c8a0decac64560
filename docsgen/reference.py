"""What the programs promise their users, read from the code: the flags of each command, the frontend's HTTP
routes and WebSocket messages, and the gradio api_names with their parameters.

The reference pages of the documentation site are rendered from this (`docsgen/pages.py`), and
tests/test_docs.py checks the hand-written pages against it, so a renamed flag, route or api_name cannot
leave the docs behind.

    for program in programs(): program.name, program.parser     # argparse parsers, never run
    routes()            # [Route(methods, path, summary)] of a frontend's HTTP and WebSocket API
    gradio_endpoints()  # {api_name: Endpoint(parameters, description)} of the gradio_client API
"""
from __future__ import annotations

import argparse
import importlib
import tempfile
from dataclasses import dataclass
from functools import cache


@dataclass(frozen=True)
class Program:
    name: str  # how a user starts it
    module: str  # where its parser lives (`build_parser()`)
    summary: str
    inherits: str | None = None  # the program whose flags it also takes

    @property
    def parser(self) -> argparse.ArgumentParser:
        return importlib.import_module(self.module).build_parser()

    def flags(self) -> list[argparse.Action]:
        """Its own options and positionals, in the parser's order (not -h)."""
        return [a for a in self.parser._actions if not isinstance(a, argparse._HelpAction)]


PROGRAMS = (
    Program("python app.py", "cosy.frontend.options",
            "The frontend: WebUI, gradio_client API, HTTP and WebSocket APIs (also `cosy-frontend`)."),
    Program("python launch/backend.py", "cosy.deploy.backend",
            "The backend: the speech-token LM on vLLM's OpenAI-compatible server (also `cosy-backend`). "
            "Arguments after `--` go to vLLM unchanged."),
    Program("python -m cosy", "cosy.__main__", "One utterance to an audio file (also `cosy`)."),
    Program("python -m cosy batch", "cosy.batch.cli",
            "A manifest in, audio files out.", inherits="python app.py"),
    Program("python -m cosy.deploy.haproxy", "cosy.deploy.haproxy",
            "Writes the HAProxy configuration for a set of frontends (its output is haproxy.cfg)."),
    Program("python -m cosy.random_model", "cosy.verify.random_model.__main__",
            "Writes a random-weight model directory in a family's official layout (tests, benchmarks)."),
    Program("python -m cosy.golden_check", "cosy.verify.golden_check",
            "Recomputes the cases of a golden directory (outputs of the official code) with our code."),
)


def programs() -> tuple[Program, ...]:
    return PROGRAMS


def option_names(program: Program) -> set[str]:
    """Every option string a program accepts (`--model_dir`, ...), inherited ones included."""
    names = {s for a in program.flags() for s in a.option_strings} | {"-h", "--help"}
    if program.inherits:
        names |= option_names(next(p for p in PROGRAMS if p.name == program.inherits))
    return names


@dataclass(frozen=True)
class Route:
    methods: tuple[str, ...]  # ("WEBSOCKET",) for a WebSocket route
    path: str
    summary: str


@cache
def _service():
    """A frontend service that is never started: its routes and endpoints are declared, nothing runs."""
    from cosy.deploy.data_dir import DataDir
    from cosy.frontend import server  # noqa: F401 -- Gradio's environment before Gradio is imported
    from cosy.frontend.service import FrontendService
    from cosy.service.workers import EngineSpec, WorkerPool
    return FrontendService(WorkerPool(EngineSpec("(not loaded)")), DataDir(tempfile.mkdtemp(prefix="cosy-docs-")))


def routes() -> list[Route]:
    """The frontend's API routes as `cosy.frontend.http_api.build_router` declares them (a trailing slash,
    which every route also accepts, is not listed twice)."""
    from cosy.frontend.http_api import build_router
    router = build_router(_service(), api_key=None, ready=lambda: (True, ""))
    out: dict[tuple[tuple[str, ...], str], Route] = {}
    for r in router.routes:
        methods = tuple(sorted(getattr(r, "methods", None) or ())) or ("WEBSOCKET",)
        path = r.path.rstrip("/") or "/"
        doc = (getattr(r, "endpoint", None).__doc__ or "").strip()
        out.setdefault((methods, path), Route(methods, path, " ".join(doc.split("\n\n")[0].split())))
    return list(out.values())


@dataclass(frozen=True)
class Parameter:
    name: str
    type: str  # gradio_client's python type: str, int, float, bool, filepath
    default: object  # None: required
    required: bool


@dataclass(frozen=True)
class Endpoint:
    parameters: tuple[Parameter, ...]
    returns: str
    description: str


def gradio_endpoints() -> dict[str, Endpoint]:
    """The named endpoints gradio_client sees (`Client.view_api`), from the Blocks the frontend registers."""
    import gradio as gr

    from cosy.frontend import gradio_api
    with gr.Blocks() as blocks:
        gradio_api.register(_service())
    named = blocks.get_api_info()["named_endpoints"]
    out = {}
    for name, e in named.items():
        params = tuple(Parameter(p["parameter_name"], p["python_type"]["type"], p.get("parameter_default"),
                                 not p.get("parameter_has_default", False)) for p in e["parameters"])
        returns = ", ".join(r["python_type"]["type"] for r in e["returns"])
        out[name] = Endpoint(params, returns, " ".join((e.get("description") or "").split()))
    return out


def websocket_messages() -> dict[str, dict[str, tuple[str, ...]]]:
    """Per WebSocket protocol, the messages a client sends and the events it gets back."""
    from cosy.frontend import ws_openai, ws_tasks
    return {
        "task protocol (PAI /api-ws/v1/audio/speech, DashScope /api-ws/v1/inference)":
            {"client": ws_tasks.CLIENT_ACTIONS, "server": ws_tasks.SERVER_EVENTS},
        "OpenAI-style session (/v1/audio/speech/stream)":
            {"client": ws_openai.CLIENT_TYPES, "server": ws_openai.SERVER_TYPES},
    }


@dataclass(frozen=True)
class Series:
    name: str
    kind: str  # counter, gauge, histogram
    labels: tuple[str, ...]
    help: str


def metrics() -> list[Series]:
    """The Prometheus series a frontend's /metrics serves (`cosy.frontend.metrics.Metrics`), with the labels
    each collector declares (a labelled series shows no sample until its first observation)."""
    registry = _service().metrics.registry
    out = []
    for collector in list(registry._collector_to_names):
        declared = tuple(getattr(collector, "_labelnames", ()))
        for family in collector.collect():
            kind = getattr(collector, "_type", family.type)
            name = family.name + ("_total" if kind == "counter" else "")  # as /metrics exposes it
            out.append(Series(name, kind, declared, family.documentation))
    return sorted(out, key=lambda s: s.name)
