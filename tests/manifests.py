"""What the deployment tests read: compose.yaml, deploy/k8s/*.yaml and the two programs' argparse parsers
(built in one subprocess: importing the frontend pulls torch and gradio, kept out of the test process).
Used by tests/test_manifests.py (the files themselves) and tests/test_manifest_flags.py (the files against
the programs)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
COMPOSE = ROOT / "compose.yaml"
HAPROXY_CFG = ROOT / "deploy" / "haproxy.cfg"
HTTP_API = ROOT / "cosy" / "frontend" / "http_api.py"
BACKEND_SRC = ROOT / "cosy" / "deploy" / "backend.py"
ROLES = ("backend", "frontend")

# Each program's parser (its `build_parser()`: nothing after parsing runs, no device checks, no key files), in a
# fresh process. Prints JSON per role: the option strings, the defaults by dest, and the help text.
_PARSERS_SCRIPT = r"""
import json, sys
from cosy.deploy import backend
from cosy.frontend import options
out = {}
for role, p in (("backend", backend.build_parser()), ("frontend", options.build_parser())):
    out[role] = {"flags": sorted(s for a in p._actions for s in a.option_strings),
                 "defaults": {a.dest: a.default for a in p._actions
                              if isinstance(a.default, (int, float, str, type(None)))},
                 "help": p.format_help()}
json.dump(out, sys.stdout)
"""



# ---------------------------------------------------------------------------------------------- loading

def k8s_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def k8s_docs() -> list[tuple[str, dict]]:
    docs = []
    for path in k8s_files():
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc is not None:
                docs.append((f"{path.name}#{i}:{doc.get('kind')}/{doc.get('metadata', {}).get('name')}", doc))
    return docs


def k8s_find(kind: str, name: str) -> dict:
    found = [d for _, d in k8s_docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name} in deploy/k8s, found {len(found)}"
    return found[0]


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def role_of_image(image: str) -> str | None:
    """`cosy-backend:gpu`, `${COSY_FRONTEND_IMAGE:-localhost/cosy-frontend:cpu}` -> the role, else None."""
    m = re.search(r"cosy-(backend|frontend):", image)
    return m.group(1) if m else None


def compose_programs() -> list[tuple[str, str, list[str]]]:
    """(service, role, command) of each compose service that runs cosy (the proxy runs haproxy)."""
    out = []
    for name, svc in compose()["services"].items():
        role = role_of_image(svc.get("image", ""))
        build_role = (svc.get("build") or {}).get("args", {}).get("ROLE")
        if role is None and build_role is None:
            continue
        assert role is None or build_role is None or role == build_role, f"{name}: image vs build ROLE"
        out.append((name, role or build_role, list(svc.get("command", []))))
    return out


def k8s_containers() -> list[tuple[str, str, dict]]:
    """(deployment/container, role, container) of each cosy container in deploy/k8s."""
    out = []
    for _, doc in k8s_docs():
        if doc["kind"] != "Deployment":
            continue
        for c in doc["spec"]["template"]["spec"]["containers"]:
            role = role_of_image(c["image"])
            assert role, f"{doc['metadata']['name']}/{c['name']}: image {c['image']!r} names no cosy role"
            out.append((f"{doc['metadata']['name']}/{c['name']}", role, c))
    return out


def used_flags(args: list[str]) -> list[str]:
    """The `--flag` of each `--flag=value` / `--flag` argument."""
    return [a.split("=", 1)[0] for a in args if a.startswith("--")]


def flag_value(args: list[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
        if a == flag and i + 1 < len(args):
            return args[i + 1]
    return None


def missing_flags(used: list[str], known: set[str]) -> list[str]:
    """The flags of `used` that the parser (its option strings `known`) does not define."""
    return [f for f in used if f not in known]


@pytest.fixture(scope="module")
def parsers() -> dict:
    r = subprocess.run([sys.executable, "-c", _PARSERS_SCRIPT], cwd=ROOT, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout)


def effective_port(parsers: dict, role: str, args: list[str]) -> int:
    given = flag_value(args, "--port")
    return int(given) if given is not None else int(parsers[role]["defaults"]["port"])
