"""The registry of model families: every module in this package defines one `FAMILY` (a `ModelFamily`).

Families are discovered with `pkgutil` rather than listed: adding CosyVoice3 means adding
`cosyvoice3.py` here (plus its model code), with no list or conditional to edit anywhere else. The modules
hold data only (classes are "module:attribute" strings), so importing them all is cheap. Families that live
elsewhere (tests, plugins) join through `register`.

    family = detect("path/to/CosyVoice2-0.5B")   # by the yaml file name, as the official AutoModel
    family = get("cosyvoice2")                   # by name (e.g. `cosy_family` of an exported config.json)
"""
from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from cosy.model.family import ModelFamily

_REGISTRY: dict[str, ModelFamily] = {}


def register(family: ModelFamily) -> ModelFamily:
    """Add a family (idempotent for the same object); ValueError when its name or yaml is taken."""
    for other in _REGISTRY.values():
        if other is not family and (other.name == family.name or other.files.yaml == family.files.yaml):
            raise ValueError(f"model family {family.name!r} ({family.files.yaml}) clashes with {other.name!r} "
                             f"({other.files.yaml})")
    _REGISTRY[family.name] = family
    return family


def unregister(name: str) -> None:
    _REGISTRY.pop(name, None)


def families() -> tuple[ModelFamily, ...]:
    """All registered families, in registration order (this package's modules by name first)."""
    return tuple(_REGISTRY.values())


def get(name: str) -> ModelFamily:
    """The family called `name`; KeyError listing the known ones."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown model family {name!r} (known: {', '.join(_REGISTRY)})") from None


def detect(path: str | Path) -> ModelFamily | None:
    """The family whose yaml the directory holds; None when none does. ValueError when several do."""
    found = [f for f in _REGISTRY.values() if (Path(path) / f.files.yaml).is_file()]
    if len(found) > 1:
        raise ValueError(f"{path} holds the yaml of several model families ({', '.join(f.files.yaml for f in found)})"
                         ": keep only the one of its model")
    return found[0] if found else None


def yaml_names() -> tuple[str, ...]:
    return tuple(f.files.yaml for f in _REGISTRY.values())


for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    register(importlib.import_module(f"{__name__}.{_module}").FAMILY)

__all__ = ["detect", "families", "get", "register", "unregister", "yaml_names"]
