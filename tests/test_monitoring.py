"""The monitoring files against the programs: deploy/monitoring's Prometheus configuration (what compose runs), its
alerting rules, the Grafana dashboard and deploy/autoscaling's adapter rules name only series a frontend or the
backend serves, and scrape the compose services on their ports with the compose secret. (The stack itself:
tests/test_images.py, where the Prometheus of the compose image loads the rules, healthy, and answers queries
for the series.)"""
from __future__ import annotations

import json
import re

import pytest
import yaml
from manifests import COMPOSE, ROOT, compose, flag_value

pytestmark = pytest.mark.quick

MONITORING = ROOT / "deploy" / "monitoring"
PROMETHEUS_YML = MONITORING / "prometheus.yml"
ALERTS = MONITORING / "alerts.yml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
ADAPTER = ROOT / "deploy" / "autoscaling" / "prometheus-adapter.yaml"
# vLLM's series that the files use (vLLM's own /metrics; its names are vLLM's to keep)
VLLM_SERIES = {"vllm:num_requests_running", "vllm:num_requests_waiting"}


def frontend_series() -> set[str]:
    """Every series name a frontend's /metrics can serve (`cosy.frontend.metrics.Metrics`): each metric with
    its exposition suffixes (_total, _bucket, _sum, _count)."""
    from cosy.frontend.metrics import Metrics
    stats = {"waiting": 0, "workers": 1, "busy": 0, "waiting_by_priority": {"bulk": 0}}
    registry = Metrics(lambda: stats, lambda: 8).registry
    names = set().union(*registry._collector_to_names.values())
    return names | {family.name for collector in list(registry._collector_to_names) for family in collector.collect()}


def series_in(expr: str) -> set[str]:
    """The series names a PromQL expression selects (cosy_* and vllm:*)."""
    return set(re.findall(r"\b(?:cosy_[a-z_]+|vllm:[a-z_]+)\b", expr))


def alert_exprs() -> list[str]:
    return [rule["expr"] for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    out = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    return out + [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]


def adapter_rules() -> list[dict]:
    return yaml.safe_load(yaml.safe_load(ADAPTER.read_text())["data"]["config.yaml"])["rules"]


@pytest.mark.parametrize("where", ["alerts", "dashboard", "adapter"])
def test_every_series_they_use_is_served(where):
    exprs = {"alerts": alert_exprs, "dashboard": dashboard_exprs,
             "adapter": lambda: [r["metricsQuery"] + r["seriesQuery"] for r in adapter_rules()]}[where]()
    used = set().union(*map(series_in, exprs))
    assert len(used) >= 3, used
    unknown = used - frontend_series() - VLLM_SERIES
    assert not unknown, f"deploy/{where}: no such series {sorted(unknown)}"


def test_the_check_of_series_names_can_fail():
    assert series_in('rate(cosy_streams_totl{priority="x"}[5m]) / vllm:num_requests_waiting') == {
        "cosy_streams_totl", "vllm:num_requests_waiting"}
    assert "cosy_streams_totl" not in frontend_series() and "cosy_streams_total" in frontend_series()


def test_prometheus_scrapes_every_compose_program_with_the_compose_key():
    conf = yaml.safe_load(PROMETHEUS_YML.read_text())
    services = compose()["services"]
    prom = services["prometheus"]
    secret_path = "/run/secrets/" + prom["secrets"][0]
    assert prom["secrets"] == ["llm_api_key"]
    targets = {}
    for job in conf["scrape_configs"]:
        assert job["authorization"]["credentials_file"] == secret_path, job["job_name"]
        for static in job["static_configs"]:
            for target in static["targets"]:
                host, port = target.split(":")
                targets[host] = int(port)
    programs = {name for name, svc in services.items() if "cosy-" in svc.get("image", "")} - {"prometheus"}
    assert set(targets) == programs == {"backend", "frontend1", "frontend2"}
    for host, port in targets.items():
        assert int(flag_value(services[host]["command"], "--port")) == port, host
    mounts = {v.split(":")[1]: v.split(":")[0] for v in prom["volumes"] if v.startswith("./")}
    assert mounts["/etc/prometheus/prometheus.yml"] == "./deploy/monitoring/prometheus.yml"
    for rule_file in conf["rule_files"]:
        assert (ROOT / mounts[rule_file]).is_file(), rule_file
    assert "cosy-metrics:/prometheus" in prom["volumes"] and "cosy-metrics" in compose()["volumes"]
    containerfile = (MONITORING / "Containerfile").read_text()
    assert "apt-get install -y --no-install-recommends prometheus" in containerfile  # Debian's package
    assert prom["build"]["dockerfile"] == "deploy/monitoring/Containerfile" and COMPOSE.parent == ROOT


def test_the_hpa_scales_on_the_adapters_metrics():
    hpa = yaml.safe_load((ROOT / "deploy" / "autoscaling" / "hpa.yaml").read_text())
    wanted = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}
    served = {r["name"]["as"] for r in adapter_rules()}
    assert wanted == served == {"cosy_queue_wait_seconds_mean", "cosy_stream_underrun_share"}
    for rule in adapter_rules():
        assert re.search(rule["name"]["matches"], rule["seriesQuery"].split("{")[0])
        assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}

