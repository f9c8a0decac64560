"""Shared fixtures: the golden data copied into the repo, and random model directories built on demand."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
GOLDEN = FIXTURES / "golden"
GOLDEN_CV3 = FIXTURES / "golden-cv3"
STATE_DICT_LIST = FIXTURES / "cosyvoice2-state-dict.txt"
STATE_DICT_LIST_CV3 = FIXTURES / "cosyvoice3-state-dict.txt"
ASSETS = Path(__file__).parent.parent / "assets"


def reference_entries(section: str, path: Path = STATE_DICT_LIST) -> list[tuple[str, tuple[int, ...], str]]:
    """(key, shape, dtype) in file order for one section ('llm', 'flow', 'hift') of the official list
    (`path`: CosyVoice2's by default, STATE_DICT_LIST_CV3 for CosyVoice3)."""
    out, current = [], None
    for line in path.read_text().splitlines():
        if line.startswith("###"):
            current = line.split()[1]
        elif current == section and line.strip() and not line.startswith("#"):
            key, dims, dtype = re.fullmatch(r"(\S+) \(([\d, ]*)\) (\S+)", line.strip()).groups()
            out.append((key, tuple(int(d) for d in dims.split(",") if d.strip()), dtype))
    return out


def reference_shapes(section: str, path: Path = STATE_DICT_LIST) -> dict[str, tuple[int, ...]]:
    return {key: shape for key, shape, _ in reference_entries(section, path)}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from cosy.verify.random_model import write_random_model
    return write_random_model(tmp_path_factory.mktemp("tiny"), "tiny", seed=1)


@pytest.fixture(scope="session")
def tiny_cv3_model_dir(tmp_path_factory) -> Path:
    """A tiny random CosyVoice3 directory from our builder (`python -m cosy.random_model --family cosyvoice3`)."""
    from cosy.verify.random_model import write_random_model
    return write_random_model(tmp_path_factory.mktemp("tiny_cv3"), "tiny", seed=2, family="cosyvoice3")


@pytest.fixture(scope="session")
def full_model_dir(tmp_path_factory) -> Path:
    from cosy.verify.random_model import write_random_model
    return write_random_model(tmp_path_factory.mktemp("full"), "full", seed=0)


SESSION_BACKENDS = {"backend": "tiny_model_dir", "cv3_backend": "tiny_cv3_model_dir"}  # fixture: its model dir


@pytest.fixture(scope="session")
def launched_backends(request, tmp_path_factory) -> dict:
    """Every session backend that a collected test needs, launched at once when the first is asked for:
    vLLM's start-up (about a minute of imports on a slow CPU) then overlaps instead of running twice.
    Each fixture below waits for its own and stops it; one never asked for is stopped at the end."""
    from servers import Backend
    needed = {name for item in request.session.items for name in SESSION_BACKENDS
              if name in getattr(item, "fixturenames", ())}
    launched = {}
    for name in sorted(needed):
        folder = tmp_path_factory.mktemp(name)
        launched[name] = Backend(request.getfixturevalue(SESSION_BACKENDS[name]), folder / "cache",
                                 folder / "backend.log")
        launched[name].launch()
    yield launched
    for b in launched.values():
        b.stop()


def _session_backend(request, name: str):
    """The context of session backend `name`: the one `launched_backends` launched, else a new one."""
    from servers import running_backend
    launched = request.getfixturevalue("launched_backends").get(name)
    folder = None if launched else request.getfixturevalue("tmp_path_factory").mktemp(name)
    return running_backend(request.getfixturevalue(SESSION_BACKENDS[name]), folder, launched)


@pytest.fixture(scope="session")
def backend(request):
    """One real vLLM backend on the tiny model for the whole session (~40 s to start on the CPU):
    `.url` (".../v1"), `.api_key`, `.port`, `.model_name`, `.stop()`, `.start()` (same port)."""
    with _session_backend(request, "backend") as b:
        yield b


@pytest.fixture(scope="session")
def cv3_backend(request):
    """One real vLLM backend on the tiny CosyVoice3 model for the whole session (as `backend`)."""
    with _session_backend(request, "cv3_backend") as b:
        yield b


from http_stack import stack  # noqa: E402,F401 -- the HTTP API tests' module-scoped server fixture
