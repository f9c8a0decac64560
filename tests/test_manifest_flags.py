"""The deployment files against the programs they start: every flag that compose.yaml and deploy/k8s pass
exists, health checks take no flags, probes hit routes the frontend serves, and the ports agree with the
programs' defaults (the files themselves: tests/test_manifests.py; what both read: tests/manifests.py).
"""
from __future__ import annotations

import json
import re
from urllib.parse import urlparse

import pytest
from manifests import (
    BACKEND_SRC,
    HAPROXY_CFG,
    HTTP_API,
    ROLES,
    ROOT,
    compose,
    compose_programs,
    effective_port,
    flag_value,
    k8s_containers,
    k8s_find,
    missing_flags,
    role_of_image,
    used_flags,
)

from cosy.deploy import healthcheck

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")

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


