"""Import Gradio without its type-stub pass.

As each of Gradio's component classes is defined, `ComponentMeta.__new__` calls
`gradio.component_meta.create_or_modify_pyi`: it reads and parses the class's own source file and rewrites the
.pyi stub beside it (in site-packages, or fails quietly where that is read-only). The stubs serve editors; they
ship in the wheel and nothing reads them at run time, and there is no switch to turn the pass off. It is a large part of
an app's start-up (`python bench/startup.py --app` measures it).

`skip_stub_pass()`, called before Gradio is first imported in a process, puts a one-shot import hook in front of
the others: when `gradio.component_meta` has run, and before any component class exists, the function is swapped
for one that does nothing. Once Gradio is imported, or if a later Gradio renames the function, it does nothing
(tests/test_import_graph.py says so when it happens).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

MODULE = "gradio.component_meta"
FUNCTION = "create_or_modify_pyi"


def _no_stub(*args: object, **kwargs: object) -> None:
    """Gradio's stub writer, skipped."""


class _StubPassHook(importlib.abc.MetaPathFinder):
    """Finds `gradio.component_meta` as the normal path finder does and patches it once it has run."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None):
        if fullname != MODULE:
            return None
        sys.meta_path.remove(self)  # one shot
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            if hasattr(module, FUNCTION):
                setattr(module, FUNCTION, _no_stub)

        spec.loader.exec_module = exec_module  # this loader object only serves this one module
        return spec


def skip_stub_pass() -> None:
    """Have this process import Gradio without rewriting its .pyi stubs (a no-op once Gradio is imported)."""
    if MODULE in sys.modules or any(isinstance(f, _StubPassHook) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _StubPassHook())


def stub_pass_skipped() -> bool:
    """Whether the imported Gradio runs without its stub pass."""
    module = sys.modules.get(MODULE)
    return module is not None and getattr(module, FUNCTION, None) is _no_stub
