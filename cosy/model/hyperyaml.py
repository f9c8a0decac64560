"""Read a HyperPyYAML file (the format of the official `cosyvoice2.yaml`) as plain data.

The official loader imports and calls whatever the tags name (`!new:`, `!name:`, `!apply:`), which
reseeds every RNG and needs the official package. We only want the hyperparameters, so tags become
`Tagged` records and `!ref` expressions are resolved against the document; nothing is imported or run.
"""
from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


@dataclass
class Tagged:
    """A tagged YAML node: `kind` is 'new', 'name' or 'apply'; `target` the dotted name it points at."""

    kind: str
    target: str
    value: Any  # the mapping or sequence under the tag (None when empty)

    def get(self, key: str, default: Any = None) -> Any:
        return self.value.get(key, default) if isinstance(self.value, dict) else default

    def __getitem__(self, key: str) -> Any:
        if not isinstance(self.value, dict) or key not in self.value:
            raise KeyError(f"{self.kind}:{self.target} has no argument '{key}'")
        return self.value[key]


@dataclass
class _Ref:
    expr: str  # e.g. "<chunk_size> * <token_mel_ratio>"


class _Loader(yaml.SafeLoader):
    pass


def _construct_tagged(loader: _Loader, suffix: str, node: yaml.Node) -> Tagged:
    kind, target = node.tag[1:].split(":", 1)
    if isinstance(node, yaml.MappingNode):
        value: Any = loader.construct_mapping(node, deep=True)
    elif isinstance(node, yaml.SequenceNode):
        value = loader.construct_sequence(node, deep=True)
    else:
        value = loader.construct_scalar(node) or None
    return Tagged(kind, target, value)


def _construct_ref(loader: _Loader, node: yaml.Node) -> _Ref:
    return _Ref(str(loader.construct_scalar(node)))


for _kind in ("new", "name", "apply"):
    _Loader.add_multi_constructor(f"!{_kind}:", _construct_tagged)
_Loader.add_constructor("!ref", _construct_ref)
# YAML 1.1 reads "1e-06" as a string; HyperPyYAML (ruamel) reads it as a float. Match that.
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)

_REF = re.compile(r"<([^<>]+)>")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.USub: operator.neg}


def _arith(node: ast.AST) -> Any:
    """Evaluate a tiny arithmetic expression tree (numbers and + - * / //) without eval()."""
    if isinstance(node, ast.Expression):
        return _arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.left), _arith(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.operand))
    raise ValueError("unsupported expression")


def _lookup(doc: dict, path: str) -> Any:
    value: Any = doc
    for part in path.split("."):
        if isinstance(value, Tagged):
            value = value.value
        if not isinstance(value, dict) or part not in value:
            raise KeyError(path)
        value = value[part]
    return value


def _resolve(value: Any, doc: dict, seen: tuple[str, ...] = ()) -> Any:
    if isinstance(value, _Ref):
        names = _REF.findall(value.expr)
        if not names:
            raise ValueError(f"!ref '{value.expr}' names no key")
        if any(n in seen for n in names):
            raise ValueError(f"!ref cycle through {names}")
        resolved = {n: _resolve(_lookup(doc, n), doc, seen + (n,)) for n in names}
        if _REF.fullmatch(value.expr.strip()):
            return resolved[names[0]]  # a plain reference keeps its type (mapping, Tagged, ...)
        text = _REF.sub(lambda m: repr(resolved[m.group(1)]), value.expr)
        try:
            return _arith(ast.parse(text, mode="eval"))
        except (SyntaxError, ValueError) as e:
            raise ValueError(f"!ref '{value.expr}' is not an arithmetic expression: {e}") from None
    if isinstance(value, Tagged):
        return Tagged(value.kind, value.target, _resolve(value.value, doc, seen))
    if isinstance(value, dict):
        return {k: _resolve(v, doc, seen) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, doc, seen) for v in value]
    return value


def load_hyperyaml(path: str | Path, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Parse `path` into nested dicts/lists/scalars and `Tagged` records, with every `!ref` resolved.

    `overrides` replaces top-level keys before references are resolved (like HyperPyYAML's).
    Raises ValueError naming the file when it is not valid YAML of this form.
    """
    path = Path(path)
    try:
        doc = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a readable HyperPyYAML file: {e}") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(doc).__name__}")
    doc.update(overrides or {})
    try:
        return _resolve(doc, doc)
    except (KeyError, ValueError) as e:
        raise ValueError(f"{path}: cannot resolve a reference: {e}") from None
