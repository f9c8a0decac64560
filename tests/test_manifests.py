"""The deployment files themselves: compose.yaml and deploy/k8s/*.yaml validate and are wired together,
deploy/haproxy.cfg is what cosy.deploy.haproxy renders and haproxy accepts it (the files against the programs'
flags, routes and ports: tests/test_manifest_flags.py; what both read: tests/manifests.py).

Offline and fast: the Kubernetes schemas ship in kubernetes-validate; podman-compose and haproxy checks run
only where those tools are installed.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from manifests import (
    COMPOSE,
    HAPROXY_CFG,
    K8S,
    ROOT,
    compose,
    flag_value,
    k8s_containers,
    k8s_docs,
    k8s_files,
    k8s_find,
)

from cosy.deploy import haproxy

pytestmark = pytest.mark.quick  # the inner-loop tier (`pytest -m quick`; README "Tests")

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


# the manifests beside the base (not in its kustomization: applied on their own): the autoscaler on queue wait
# and underruns (an overlay of the base) and the indexed batch Job
EXTRA_K8S = (ROOT / "deploy" / "autoscaling", K8S / "batch")


def extra_k8s_docs() -> list[tuple[str, dict]]:
    docs = []
    for folder in EXTRA_K8S:
        for path in sorted(folder.glob("*.yaml")):
            if path.name == "kustomization.yaml":
                continue
            for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
                docs.append((f"{folder.name}/{path.name}#{i}:{doc['kind']}/{doc['metadata']['name']}", doc))
    return docs


def _validate(label: str, doc: dict) -> None:
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    from kubernetes_validate import utils
    version = utils.latest_version()
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        pytest.fail(f"{label}: Kubernetes {version}: {'.'.join(map(str, e.path))}: {e.message}")


@pytest.mark.parametrize("label,doc", extra_k8s_docs(), ids=[label for label, _ in extra_k8s_docs()])
def test_autoscaler_and_batch_job_validate(label, doc):
    _validate(label, doc)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (with its kustomize) is not installed")
@pytest.mark.parametrize("folder", [K8S, *EXTRA_K8S], ids=lambda f: f.name)
def test_each_kustomization_renders_valid_objects(folder):
    r = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    for doc in docs:
        _validate(f"{folder.name}: {doc['kind']}/{doc['metadata']['name']}", doc)
    if folder.name == "autoscaling":  # the base with its HPA replaced: scaled on the adapter's metrics and CPU
        (hpa,) = [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]
        assert [m["type"] for m in hpa["spec"]["metrics"]] == ["Pods", "Pods", "Resource"]
        assert len(docs) == len(k8s_docs())


def test_the_batch_job_runs_shard_i_of_n_in_pod_i(parsers):
    """An indexed Job of n completions, each pod's `--shard` its completion index over n; the flags exist, the
    claims, the Secret and the key file are the base's."""
    from manifests import missing_flags, used_flags

    from cosy.batch.cli import build_parser
    from cosy.batch.manifest import parse_shard
    (job,) = [d for _, d in extra_k8s_docs() if d["kind"] == "Job"]
    spec = job["spec"]
    (c,) = spec["template"]["spec"]["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert spec["completionMode"] == "Indexed" and spec["template"]["spec"]["restartPolicy"] == "Never"
    assert spec["completions"] == spec["parallelism"] == int(env["SHARDS"]["value"])
    assert env["JOB_COMPLETION_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    shard = flag_value(c["args"], "--shard")
    assert shard == "$(JOB_COMPLETION_INDEX)/$(SHARDS)"
    n = spec["completions"]
    assert [parse_shard(shard.replace("$(JOB_COMPLETION_INDEX)", str(i)).replace("$(SHARDS)", str(n)))
            for i in range(n)] == [(i, n) for i in range(n)]
    assert c["command"] == ["python3", "-m", "cosy", "batch"] and not c["args"][0].startswith("-")
    known = {s for a in build_parser()._actions for s in a.option_strings} | set(parsers["frontend"]["flags"])
    assert missing_flags(used_flags(c["args"]), known) == []
    names = {(d["kind"], d["metadata"]["name"]) for _, d in k8s_docs()}
    for vol in spec["template"]["spec"]["volumes"]:
        if "persistentVolumeClaim" in vol:
            assert ("PersistentVolumeClaim", vol["persistentVolumeClaim"]["claimName"]) in names
        if "secret" in vol:
            assert ("Secret", vol["secret"]["secretName"]) in names
    (fe,) = [x for _, role, x in k8s_containers() if role == "frontend"]
    assert flag_value(c["args"], "--llm_api_key_file") == flag_value(fe["args"], "--llm_api_key_file")
    assert flag_value(c["args"], "--llm_base_url") == flag_value(fe["args"], "--llm_base_url")
    # a line that failed fails the same way again: that index is not retried (exit 1); a stopped run is (exit 2)
    (rule,) = spec["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailIndex" and rule["onExitCodes"]["values"] == [1]


def test_frontend_shutdown_fits_the_grace_period(parsers):
    """preStop sleep + --drain_timeout must end before Kubernetes kills the pod."""
    dep = k8s_find("Deployment", "cosy-frontend")["spec"]["template"]["spec"]
    (c,) = dep["containers"]
    sleep = c["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep"
    drain = flag_value(c["args"], "--drain_timeout")
    drain = float(drain) if drain is not None else float(parsers["frontend"]["defaults"]["drain_timeout"])
    assert float(sleep[1]) + drain < dep["terminationGracePeriodSeconds"]


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


def test_haproxy_names_the_client_to_the_frontends():
    """HAProxy sends X-Forwarded-For (the frontends' --trusted_proxies makes them believe it)."""
    assert "\n    option forwardfor\n" in HAPROXY_CFG.read_text()


# ---------------------------------------------------------------------------------------------- compose

def _trusted_proxy_wiring(doc: dict) -> tuple[list[str], str, str]:
    """(each frontend's --trusted_proxies, the proxy's address, the compose network's subnet) of a compose
    document whose variables are filled in."""
    trusted = [flag_value(svc["command"], "--trusted_proxies") for name, svc in doc["services"].items()
               if name.startswith("frontend")]
    address = doc["services"]["proxy"]["networks"]["default"]["ipv4_address"]
    (subnet,) = [c["subnet"] for c in doc["networks"]["default"]["ipam"]["config"]]
    return trusted, address, subnet


def _filled(text: str, env: dict[str, str]) -> dict:
    """compose.yaml with `${VAR:-default}` filled in from `env` (what compose does with the environment)."""
    return yaml.safe_load(re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1), m.group(2)), text))


def test_compose_frontends_trust_the_proxy_and_only_it():
    """The frontends believe X-Forwarded-For from the proxy's fixed address only (not the whole network: the
    published port's connections come from its gateway), by default and with both variables moved."""
    import ipaddress
    for env in ({}, {"COSY_SUBNET": "10.77.5.0/24", "COSY_PROXY_ADDRESS": "10.77.5.20"}):
        trusted, address, subnet = _trusted_proxy_wiring(_filled(COMPOSE.read_text(), env))
        assert trusted == [address, address], (env, trusted)
        assert ipaddress.ip_address(address) in ipaddress.ip_network(subnet), (env, address, subnet)
        assert address == env.get("COSY_PROXY_ADDRESS", address)



def test_compose_loads():
    doc = compose()
    assert set(doc["services"]) == {"backend", "frontend1", "frontend2", "proxy", "prometheus"}
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
    trusted, address, subnet = _trusted_proxy_wiring(rendered)  # podman-compose reads the network settings
    assert trusted == [address, address] and address.startswith(subnet.rsplit(".", 1)[0] + ".")
