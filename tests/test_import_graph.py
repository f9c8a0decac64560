"""cosy's import structure: the library never imports `launch` (scripts import the library, not back), and
cosy's modules have no import cycles at module level (a cycle makes import order matter and half-initialised
modules possible)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "cosy"


def modules() -> dict[str, Path]:
    out = {}
    for f in sorted(PKG.rglob("*.py")):
        parts = list(f.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = f
    return out


MODULES = modules()


def _absolute(node: ast.ImportFrom, module: str, path: Path) -> str:
    if not node.level:
        return node.module or ""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    base = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _known(name: str) -> str | None:
    """The cosy module `name` resolves to: itself, else its longest prefix that is a module."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imported_names(tree: ast.AST, module: str, path: Path, nodes) -> set[str]:
    """Dotted names of every import among `nodes`, absolute; `from x import y` gives x.y where that is a module."""
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, path)
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES}
    return out


def module_level_edges() -> dict[str, set[str]]:
    """module -> cosy modules it imports at module level (top-level statements, including under if/try)."""
    edges = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        nodes, todo = [], list(tree.body)
        while todo:  # module level: the top-level statements and the blocks of top-level if/try/with
            node = todo.pop()
            nodes.append(node)
            if isinstance(node, (ast.If, ast.Try, ast.With)):
                todo += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", []),
                         *[s for h in getattr(node, "handlers", []) for s in h.body]]
        names = imported_names(tree, module, path, nodes)
        edges[module] = {k for n in names if n.split(".")[0] == "cosy" and (k := _known(n)) and k != module}
    return edges


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    cycles, state, stack = [], {}, []

    def visit(u: str) -> None:
        state[u] = "open"
        stack.append(u)
        for v in sorted(edges.get(u, ())):
            if state.get(v) == "open":
                cycles.append(stack[stack.index(v):] + [v])
            elif v not in state:
                visit(v)
        stack.pop()
        state[u] = "done"

    for m in sorted(edges):
        if m not in state:
            visit(m)
    return cycles


def test_library_never_imports_launch():
    bad = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        for n in imported_names(tree, module, path, ast.walk(tree)):  # also imports inside functions
            if n == "launch" or n.startswith("launch."):
                bad.append(f"{path.relative_to(ROOT)} imports {n}")
    assert not bad, "\n".join(bad)


def test_no_import_cycles_between_cosy_modules():
    cycles = find_cycles(module_level_edges())
    for c in cycles:
        print("import cycle:", " -> ".join(c))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_cycle_finder_finds_a_cycle():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_cli_and_benchmarks_need_no_gradio_vllm_or_openai():
    """What bench/gpu_check.sh runs on a bare CUDA image (preinstalled torch + bench/gpu_wheels.txt): the CLI,
    the random model builder and the in-process benchmarks import none of the frontend's or backend's stacks."""
    import subprocess
    import sys
    code = ("import sys; sys.path.insert(0, 'bench'); import cosy.__main__, cosy.verify.random_model.__main__, "
            "synthesis, lm_throughput, dtype_diff, compile_check, flow_batch; "
            "print(sorted(m for m in ('gradio', 'vllm', 'openai', 'fastapi', 'httpx') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_frontends_server_and_flags_need_no_openai():
    """An app whose LM is embedded never talks to a backend: its server module and its flags (whose stall and
    queue defaults belong to the LM's token clock, cosy.lm.watchdog) import no openai (0.8 CPU s a start)."""
    import subprocess
    import sys
    code = ("import sys; import cosy.frontend.server as s; s.parse_args(['--model_dir', 'm']); "
            "print(sorted(m for m in ('openai', 'cosy.lm.remote') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_the_frontends_server_imports_gradio_without_its_type_stub_pass():
    """The server's Gradio skips rewriting its .pyi stubs as each component class is defined (1.4 CPU s of an
    app's start, cosy.frontend.gradio_stubs), and its components still work; a plain `import gradio` keeps
    the pass. If a Gradio upgrade renames or moves the function, the first line reads False here."""
    import subprocess
    import sys
    code = ("import sys; import cosy.frontend.server; import gradio as gr\n"
            "from cosy.frontend.gradio_stubs import stub_pass_skipped\n"
            "class Extra(gr.Textbox): pass\n"  # ComponentMeta runs the (skipped) pass for a new class too
            "with gr.Blocks() as b:\n    a = gr.Audio(type='filepath'); t = Extra(value='x')\n"
            "print(stub_pass_skipped(), a.type, t.value)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "True filepath x", out.stdout
    code = ("import gradio, gradio.component_meta as m; from cosy.frontend.gradio_stubs import stub_pass_skipped\n"
            "print(stub_pass_skipped(), m.create_or_modify_pyi.__module__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "False gradio.component_meta", out.stdout


def test_the_container_healthcheck_imports_the_standard_library_only():
    """`python3 -m cosy.deploy.healthcheck` runs every few seconds in every container: importing `cosy` for it
    must not import torch or numpy (it once did, through cosy/__init__.py: 2.4 s of CPU per check, about
    half a core per container at compose's 5 s interval); the package's own names still load on use."""
    import subprocess
    import sys
    code = ("import sys, runpy; sys.argv = ['healthcheck', 'http://127.0.0.1:9/health']\n"
            "try:\n    runpy.run_module('cosy.deploy.healthcheck', run_name='__main__')\nexcept SystemExit as e:\n"
            "    print(e.code, sorted(m for m in ('torch', 'numpy', 'yaml') if m in sys.modules))\n"
            "import cosy; print(cosy.load_token2wav.__module__, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["1 []", "cosy.pipeline.token2wav True"], out.stdout


def test_a_worker_running_the_frontends_script_again_imports_no_server():
    """Each synthesis worker is a spawned process, and spawn first runs its parent's main script again, as
    `__mp_main__` (multiprocessing's `_fixup_main_from_path`: runpy.run_path): app.py, or pip's
    `cosy-frontend` script, whose top imports the target that pyproject.toml names. Through a top-level
    import of the server, every worker loaded Gradio, FastAPI and the HTTP APIs that only the parent uses."""
    import subprocess
    import sys

    import tomllib
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["cosy-frontend"]
    module, _, function = target.partition(":")
    code = ("import importlib, runpy, sys\n"
            "runpy.run_path('app.py', run_name='__mp_main__')\n"
            f"assert callable(getattr(importlib.import_module({module!r}), {function!r}))\n"
            "print(sorted(m for m in ('cosy.frontend.server', 'gradio', 'fastapi', 'uvicorn', 'torch')"
            " if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.parametrize("family", ["cosyvoice2", "cosyvoice3"])
def test_a_worker_building_its_engine_imports_no_dynamo_openai_or_typeguard_instrumentation(family, request):
    """A speech worker's start (`worker_main`, as app.py's workers run it, its engine built as the CLI's is):
    it once paid a second for torch._dynamo (imported by an nn.Embedding's random init on the meta device,
    thrown away at load), 1.5 s for typeguard instrumenting inflect's methods at import, and, with the LM
    embedded, the LM backends' client and openai. None is needed; the numbers are still spelled."""
    import subprocess
    import sys
    model = request.getfixturevalue("tiny_model_dir" if family == "cosyvoice2" else "tiny_cv3_model_dir")
    code = ("import sys, threading, typeguard; checked = typeguard.typechecked\n"
            "from multiprocessing import Pipe\n"
            "from cosy.service.process import EngineSpec, worker_main\n"
            "parent, child = Pipe()\n"
            "said = []\n"
            "def look():\n"
            "    said.append(parent.recv()[0])  # 'ready' once the engine is built\n"
            "    import inflect\n"
            "    said.append(('torch._dynamo' in sys.modules, 'openai' in sys.modules,\n"
            "                 typeguard.typechecked is checked,\n"
            "                 'check_argument_types' in inflect.engine.number_to_words.__code__.co_names))\n"
            "    parent.send(None)  # the worker's loop ends\n"
            "looking = threading.Thread(target=look)\n"
            "looking.start()\n"
            f"worker_main(EngineSpec({str(model)!r}), child)  # in the main thread: it sets signal handlers\n"
            "looking.join()\n"
            "print(*said)\n"
            "from cosy.text.normalize import NumberSpeller; print(NumberSpeller()('year 2024, 7 days'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    expected = ["ready (False, False, True, False)", "year two thousand and twenty-four, seven days"]
    assert out.stdout.splitlines() == expected, (out.stdout, out.stderr[-2000:])
