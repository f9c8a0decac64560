"""The deployment files against the programs they start: compose.yaml, deploy/k8s/*.yaml, deploy/haproxy.cfg.

Offline and fast: the Kubernetes schemas ship in kubernetes-validate; the programs' argparse parsers are built
in one subprocess (importing the frontend pulls torch and gradio, kept out of this process); podman-compose
and haproxy checks run only where those tools are installed.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from cosy.deploy import haproxy, healthcheck

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
COMPOSE = ROOT / "compose.yaml"
HAPROXY_CFG = ROOT / "deploy" / "haproxy.cfg"
HTTP_API = ROOT / "cosy" / "frontend" / "http_api.py"
BACKEND_SRC = ROOT / "cosy" / "deploy" / "backend.py"
ROLES = ("backend", "frontend")

# Builds each program's parser without running it: argparse.ArgumentParser.parse_args is replaced by one that
# hands the parser back, so nothing after parsing (device checks, key files) runs. Prints JSON per role: the
# option strings, the defaults by dest, and the help text.
_PARSERS_SCRIPT = r"""
import argparse, json, sys

class Got(Exception):
    def __init__(self, parser):
        self.parser = parser

def grab(self, args=None, namespace=None):
    raise Got(self)

argparse.ArgumentParser.parse_args = grab
out = {}
from cosy.deploy import backend
from cosy.frontend import server
for role, call in (("backend", lambda: backend.parse_args([])), ("frontend", lambda: server.parse_args([]))):
    try:
        call()
    except Got as g:
        p = g.parser
        out[role] = {"flags": sorted(s for a in p._actions for s in a.option_strings),
                     "defaults": {a.dest: a.default for a in p._actions
                                  if isinstance(a.default, (int, float, str, type(None)))},
                     "help": p.format_help()}
    else:
        raise SystemExit(f"{role}: parse_args did not call ArgumentParser.parse_args")
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


# ---------------------------------------------------------------------------------------------- schemas

def test_k8s_dir_has_the_manifests():
    names = {p.name for p in K8S.glob("*.yaml")}
    assert {"backend.yaml", "frontend.yaml", "storage.yaml", "secret.yaml", "kustomization.yaml"} <= names


def test_kustomization_lists_every_manifest():
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kust["kind"] == "Kustomization"
    assert sorted(kust["resources"]) == sorted(p.name for p in k8s_files())


@pytest.mark.parametrize("label,doc", k8s_docs(), ids=[label for label, _ in k8s_docs()])
def test_k8s_manifest_validates(label, doc):
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    from kubernetes_validate import utils
    version = utils.latest_version()
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        pytest.fail(f"{label}: Kubernetes {version}: {'.'.join(map(str, e.path))}: {e.message}")
    except utils.SchemaNotFoundError as e:
        pytest.fail(f"{label}: {e.message}")


def test_k8s_wiring():
    """The objects refer to each other by the right names: selectors, claims, the secret, the HPA target."""
    names = {(d["kind"], d["metadata"]["name"]) for _, d in k8s_docs()}
    for _, doc in k8s_docs():
        if doc["kind"] != "Deployment":
            continue
        spec = doc["spec"]
        labels = spec["template"]["metadata"]["labels"]
        assert spec["selector"]["matchLabels"].items() <= labels.items()
        for vol in spec["template"]["spec"].get("volumes", []):
            if "persistentVolumeClaim" in vol:
                assert ("PersistentVolumeClaim", vol["persistentVolumeClaim"]["claimName"]) in names
            if "secret" in vol:
                assert ("Secret", vol["secret"]["secretName"]) in names
    for svc in ("cosy-backend", "cosy-frontend"):
        selector = k8s_find("Service", svc)["spec"]["selector"]
        labels = k8s_find("Deployment", svc)["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), f"Service {svc} selects no pod of its Deployment"
    hpa = k8s_find("HorizontalPodAutoscaler", "cosy-frontend")["spec"]
    assert ("Deployment", hpa["scaleTargetRef"]["name"]) in names
    pdb = k8s_find("PodDisruptionBudget", "cosy-frontend")["spec"]
    fe_labels = k8s_find("Deployment", "cosy-frontend")["spec"]["template"]["metadata"]["labels"]
    assert pdb["selector"]["matchLabels"].items() <= fe_labels.items()
    assert k8s_find("PersistentVolumeClaim", "cosy-data")["spec"]["accessModes"] == ["ReadWriteMany"]
    # the key file the args name is the Secret's key under its mount
    key = k8s_find("Secret", "cosy-llm-key")
    for _, role, c in k8s_containers():
        flag = "--api_key_file" if role == "backend" else "--llm_api_key_file"
        path = Path(flag_value(c["args"], flag))
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert str(path.parent) in mounts, f"{role}: {path} is not under a mount"
        assert path.name in key["stringData"]


def test_frontend_shutdown_fits_the_grace_period(parsers):
    """preStop sleep + --drain_timeout must end before Kubernetes kills the pod."""
    dep = k8s_find("Deployment", "cosy-frontend")["spec"]["template"]["spec"]
    (c,) = dep["containers"]
    sleep = c["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    drain = flag_value(c["args"], "--drain_timeout")
    drain = float(drain) if drain is not None else float(parsers["frontend"]["defaults"]["drain_timeout"])
    assert float(sleep[1]) + drain < dep["terminationGracePeriodSeconds"]


# ---------------------------------------------------------------------------------------------- flags

def test_compose_and_k8s_flags_exist(parsers):
    used = [(f"compose {name}", role, cmd) for name, role, cmd in compose_programs()]
    used += [(f"k8s {name}", role, c.get("args", [])) for name, role, c in k8s_containers()]
    assert {role for _, role, _ in used} == set(ROLES)
    problems = []
    for where, role, args in used:
        assert not any(a.startswith("-") and not a.startswith("--") for a in args), f"{where}: short flag"
        known = set(parsers[role]["flags"])
        for flag in missing_flags(used_flags(args), known):
            program = "app.py" if role == "frontend" else "launch/backend.py"
            problems.append(f"{where}: {flag} is not a flag of the {role} ({program} --help)")
        # the help text names each flag too (what an operator reads)
        for flag in used_flags(args):
            if flag in known:
                assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", parsers[role]["help"]), flag
    assert not problems, "\n".join(problems)


def test_healthcheck_commands_take_no_flags():
    """cosy.deploy.healthcheck takes one URL argument and no flags (compose healthchecks, Containerfile)."""
    checks = [svc["healthcheck"]["test"] for svc in compose()["services"].values() if "healthcheck" in svc]
    assert len(checks) == 3  # backend, frontend1, frontend2
    for test in checks:
        assert test[:4] == ["CMD", "python3", "-m", "cosy.deploy.healthcheck"], test
        args = test[4:]
        assert len(args) <= 1 and not any(a.startswith("-") for a in args), test
    containerfile = (ROOT / "deploy" / "Containerfile").read_text()
    m = re.search(r"^HEALTHCHECK .*CMD (\[.*\])$", containerfile, re.M)
    assert m and json.loads(m.group(1)) == ["python3", "-m", "cosy.deploy.healthcheck"]


def test_flag_check_catches_a_renamed_flag(parsers):
    """The check of test_compose_and_k8s_flags_exist can fail: a misspelt flag is reported."""
    (_, _, c), = [x for x in k8s_containers() if x[1] == "frontend"]
    flags = used_flags(c["args"])
    assert "--llm_api_key_file" in flags
    known = set(parsers["frontend"]["flags"])
    assert missing_flags(flags, known) == []
    mutated = [f + "z" if f == "--llm_api_key_file" else f for f in flags]
    assert missing_flags(mutated, known) == ["--llm_api_key_filez"]
    assert missing_flags(["--nice"], known) == ["--nice"]  # a backend flag given to the frontend


# ---------------------------------------------------------------------------------------------- probes

def frontend_routes() -> set[str]:
    return set(re.findall(r'add_route\(\s*router,\s*"GET",\s*"([^"]+)"', HTTP_API.read_text()))


def probe_paths() -> list[tuple[str, str, str]]:
    """(where, role, path) of every health probe in compose and deploy/k8s, and the healthcheck default."""
    out = []
    for name, svc in compose()["services"].items():
        if "healthcheck" in svc:
            role = role_of_image(svc["image"])
            out.append((f"compose {name}", role, urlparse(svc["healthcheck"]["test"][-1]).path))
    for name, role, c in k8s_containers():
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert probe in c, f"{name}: no {probe}"
            out.append((f"k8s {name} {probe}", role, c[probe]["httpGet"]["path"]))
    for role in ROLES:
        out.append((f"healthcheck default ({role})", role,
                    urlparse(healthcheck.health_url([], {"COSY_ROLE": role})).path))
    return out


def test_probe_paths_are_served():
    routes = frontend_routes()
    assert {"/health", "/ready"} <= routes, routes
    backend_src = BACKEND_SRC.read_text()
    for where, role, path in probe_paths():
        if role == "frontend":
            assert path in routes, f"{where}: {path} is no GET route of cosy/frontend/http_api.py"
        else:
            # vLLM's own /health, the one cosy/deploy/backend.py waits for before it calls the server up
            assert path == "/health", f"{where}: {path}"
            assert '"/health"' in backend_src
    # readiness of a frontend is /ready (503 while draining or with no usable backend), not /health
    (_, _, fe), = [x for x in k8s_containers() if x[1] == "frontend"]
    assert fe["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert fe["livenessProbe"]["httpGet"]["path"] == "/health"
    assert "/ready" in HAPROXY_CFG.read_text()


# ---------------------------------------------------------------------------------------------- ports

def container_port(c: dict, port) -> int:
    """A probe's or Service's port (a number or a containerPort name) as a number."""
    if isinstance(port, int):
        return port
    (p,) = [p["containerPort"] for p in c["ports"] if p.get("name") == port]
    return p


def test_program_defaults_match_the_healthcheck_defaults(parsers):
    for role in ROLES:
        assert healthcheck.DEFAULT_PORTS[role] == int(parsers[role]["defaults"]["port"])
    assert parsers["backend"]["defaults"]["port"] == 8000
    assert parsers["frontend"]["defaults"]["port"] == 50000


def test_compose_ports(parsers):
    services = compose()["services"]
    ports = {}
    for name, role, cmd in compose_programs():
        ports[name] = port = effective_port(parsers, role, cmd)
        url = urlparse(services[name]["healthcheck"]["test"][-1])
        assert url.port == port, f"compose {name}: healthcheck on {url.port}, serves on {port}"
        if role == "frontend":
            llm = urlparse(flag_value(cmd, "--llm_base_url"))
            assert llm.hostname in services, f"compose {name}: {llm.hostname} is no service"
            assert llm.port == ports.get(llm.hostname) or llm.port == effective_port(
                parsers, "backend", services[llm.hostname]["command"]), f"compose {name}: {llm.netloc}"
    # HAProxy's frontends are the compose frontends on their ports, and it binds the published port
    cfg = HAPROXY_CFG.read_text()
    servers = re.findall(r"^\s*server \S+ (\S+):(\d+) ", cfg, re.M)
    assert servers
    for host, port in servers:
        assert host in services and int(port) == effective_port(parsers, "frontend", services[host]["command"])
    (bind,) = re.findall(r"^\s*bind \S+:(\d+)$", cfg, re.M)
    published = [p.rsplit(":", 1)[1] for p in services["proxy"]["ports"]]
    assert published == [bind]


def test_k8s_ports(parsers):
    for name, role, c in k8s_containers():
        port = effective_port(parsers, role, c["args"])
        assert [p["containerPort"] for p in c["ports"]] == [port], name
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert container_port(c, c[probe]["httpGet"]["port"]) == port, f"{name} {probe}"
        svc = k8s_find("Service", f"cosy-{role}")
        (sp,) = svc["spec"]["ports"]
        assert container_port(c, sp.get("targetPort", sp["port"])) == port, f"Service cosy-{role}"
        assert sp["port"] == port  # the Service keeps the program's port (the frontends' URL uses it)
    (_, _, fe), = [x for x in k8s_containers() if x[1] == "frontend"]
    llm = urlparse(flag_value(fe["args"], "--llm_base_url"))
    backend_svc = k8s_find("Service", llm.hostname)  # the host is the backend Service's name
    assert backend_svc["spec"]["selector"] == k8s_find("Deployment", "cosy-backend")["spec"]["selector"]["matchLabels"]
    assert llm.port in [p["port"] for p in backend_svc["spec"]["ports"]]
    assert llm.path == "/v1"


# ---------------------------------------------------------------------------------------------- haproxy

def test_haproxy_cfg_is_rendered():
    expected = haproxy.render("0.0.0.0:8080", ["frontend1:50000", "frontend2:50000"], dns=True)
    assert HAPROXY_CFG.read_text() == expected, (
        "deploy/haproxy.cfg drifted from cosy.deploy.haproxy.render: regenerate it with `python -m "
        "cosy.deploy.haproxy --bind 0.0.0.0:8080 --frontend frontend1:50000 --frontend frontend2:50000 --dns`")


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed")
def test_haproxy_accepts_cfg():
    # unresolvable compose names are warnings (init-addr none), not errors
    r = subprocess.run(["haproxy", "-c", "-f", str(HAPROXY_CFG)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


# ---------------------------------------------------------------------------------------------- compose

def test_compose_loads():
    doc = compose()
    assert set(doc["services"]) == {"backend", "frontend1", "frontend2", "proxy"}
    assert doc["services"]["frontend1"] == doc["services"]["frontend2"]  # the one anchor


def _podman_compose() -> list[str] | None:
    exe = Path(sys.executable).parent / "podman-compose"
    if exe.exists():
        return [str(exe)]
    if shutil.which("podman-compose"):
        return [shutil.which("podman-compose")]
    return None


@pytest.mark.skipif(_podman_compose() is None or shutil.which("podman") is None,
                    reason="podman-compose or podman is not installed")
def test_podman_compose_config(tmp_path):
    key = tmp_path / "llm_api_key"
    key.write_text("test-key\n")
    models = tmp_path / "models"
    models.mkdir()
    env = {**os.environ, "COSY_MODEL_DIR": str(models), "COSY_LLM_API_KEY_FILE": str(key)}
    r = subprocess.run([*_podman_compose(), "-f", str(COMPOSE), "config"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    rendered = yaml.safe_load(r.stdout)
    assert rendered["secrets"]["llm_api_key"]["file"] == str(key)
    assert any(str(v).startswith(f"{models}:/models") for v in rendered["services"]["backend"]["volumes"])
