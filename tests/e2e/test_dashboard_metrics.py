"""The Grafana dashboard (deploy/grafana) and the alert rules (deploy/prometheus/alerts.yml) use
series that a real Triton and a real gateway export, under the names and labels Prometheus stores;
and, where Debian's `prometheus` is installed, a real Prometheus scraping both parses and evaluates
every expression: each dashboard query returns data, each alert rule evaluates without error, and
the supervisor's alerts fire on a Triton restart and a stage reload.

Plus the static side, no Triton needed: the dashboard's panels, datasource and provisioning agree
with each other and with compose.yaml."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import yaml

from prensa.addresses import free_port
from prensa.gateway.settings import GatewaySettings
from prensa.triton.supervisor import SupervisorMetrics
from tests.gateway.conftest import running_gateway

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD_FILE = ROOT / "deploy" / "grafana" / "dashboards" / "prensa.json"
DATASOURCES = ROOT / "deploy" / "grafana" / "provisioning" / "datasources" / "prometheus.yml"
DASHBOARD_PROVIDERS = ROOT / "deploy" / "grafana" / "provisioning" / "dashboards" / "prensa.yml"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus.yml"
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())
DASHBOARD = json.loads(DASHBOARD_FILE.read_text())

# prensa's, TEI's and Triton's series, as written in the expressions: histograms as x_bucket/_sum/_count.
METRIC_NAME = re.compile(r"(?<![\w:$])(?:te|prensa|nv)_[A-Za-z0-9_:]*")
SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+\S+", re.M)
LABEL = re.compile(r'([a-zA-Z_]\w*)="')
ADDED_BY_PROMETHEUS = {"job", "instance"}
# Grafana's variables as a query test stands them in: every model and route.
VARIABLES = {"$__rate_interval": "1m", "$model": ".*", "$route": ".*"}


def panels(container: dict = DASHBOARD) -> Iterator[dict]:
    for panel in container["panels"]:
        yield panel
        yield from panels(panel) if panel.get("panels") else ()


def dashboard_queries() -> dict[str, str]:
    """`panel title/refId` -> PromQL, every target of every panel."""
    return {f"{p['title']}/{t['refId']}": t["expr"] for p in panels() for t in p.get("targets", [])}


def variable_queries() -> list[str]:
    return [v["definition"] for v in DASHBOARD["templating"]["list"] if v["type"] == "query"]


def alert_rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def substituted(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"a Grafana variable this test does not stand in for: {expr}"
    return expr


def exported(text: str) -> dict[str, set[str]]:
    """Sample name -> its label names, from /metrics text as it is (the names Prometheus stores:
    no `_total` added to Triton's or TEI's counters)."""
    labels: dict[str, set[str]] = defaultdict(set)
    for name, label_text in SAMPLE_LINE.findall(text):
        labels[name] |= set(LABEL.findall(label_text or ""))
    return labels


def labels_named(expr: str) -> set[str]:
    """Labels an expression groups by or selects on (`by (...)`, `{label=...}`), less Prometheus's own."""
    grouped = {name.strip() for group in re.findall(r"\bby\s*\(([^)]*)\)", expr) for name in group.split(",")}
    selected = set(re.findall(r'([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)\s*"', expr))
    return (grouped | selected) - ADDED_BY_PROMETHEUS - {""}


def get_json(url: str) -> dict:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - our own Prometheus
            return json.loads(response.read())
    except urllib.error.HTTPError as error:  # a 400 carries the parse error
        return json.loads(error.read())


# Static checks: no Triton, no Grafana binary.


def test_every_panel_has_a_title_unit_description_and_queries():
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))
    assert DASHBOARD["schemaVersion"] >= 36 and DASHBOARD["uid"] == "prensa"
    shown = [p for p in panels() if p["type"] != "row"]
    assert {p["type"] for p in shown} <= {"timeseries", "stat"}
    for panel in shown:
        assert panel["title"] and panel["description"] and panel["targets"], panel["id"]
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)) and all(t["expr"] and "legendFormat" in t for t in panel["targets"])
    cells = [(x, y) for p in panels() for x in range(p["gridPos"]["x"], p["gridPos"]["x"] + p["gridPos"]["w"])
             for y in range(p["gridPos"]["y"], p["gridPos"]["y"] + p["gridPos"]["h"])]
    assert len(cells) == len(set(cells)) and all(x < 24 for x, _ in cells), "panels overlap or leave the grid"


def test_rates_follow_the_scrape_interval():
    """Grafana's $__rate_interval (4 scrapes at least) in every range of the dashboard, never a fixed one."""
    for title, expr in dashboard_queries().items():
        assert set(re.findall(r"\[([^\]]+)\]", expr)) <= {"$__rate_interval"}, title
        assert re.findall(r"\b(rate|increase|irate)\(", expr) == [] or "$__rate_interval" in expr, title


def test_dashboard_shows_the_series_the_brief_asks_for():
    used = {name for expr in dashboard_queries().values() for name in METRIC_NAME.findall(expr)}
    assert {"te_request_count", "te_request_success", "te_request_failure", "prensa_request_duration_bucket",
            "te_request_tokenization_duration_sum", "te_request_queue_duration_sum", "te_request_inference_duration_sum",
            "te_request_input_length_sum", "te_request_input_length_count", "prensa_triton_call_size_sum",
            "prensa_triton_call_tokens_sum", "prensa_inputs_in_flight", "prensa_inputs_limit", "prensa_model_ready",
            "prensa_triton_restarts_total", "prensa_stage_reloads_total", "nv_inference_count", "nv_inference_exec_count",
            "nv_inference_queue_duration_us", "nv_inference_request_success", "nv_inference_compute_infer_duration_us",
            "nv_inference_pending_request_count", "nv_inference_request_failure", "prensa_encoder_padded_tokens",
            "prensa_encoder_real_tokens"} <= used
    quantiles = {q for expr in dashboard_queries().values()
                 for q in re.findall(r"histogram_quantile\(([\d.]+), sum by \(method, le\)", expr)}
    assert quantiles == {"0.5", "0.95", "0.99"}


def test_grafana_is_provisioned_with_the_datasource_every_panel_names():
    (source,) = yaml.safe_load(DATASOURCES.read_text())["datasources"]
    assert (source["uid"], source["type"], source["url"]) == ("prometheus", "prometheus", "http://prometheus:9090")
    scrape_interval = yaml.safe_load(PROMETHEUS_CONFIG.read_text())["global"]["scrape_interval"]
    assert source["jsonData"]["timeInterval"] == scrape_interval  # what $__rate_interval is built from
    named = [p["datasource"] for p in panels() if p["type"] != "row"]
    named += [t["datasource"] for p in panels() for t in p.get("targets", [])]
    named += [v["datasource"] for v in DASHBOARD["templating"]["list"] if v["type"] == "query"]
    assert named and all(d == {"type": "prometheus", "uid": source["uid"]} for d in named)

    grafana = COMPOSE["services"]["grafana"]
    assert re.fullmatch(r"grafana/grafana-oss:11\.\d+\.\d+", grafana["image"])
    assert grafana["ports"] == ["${PRENSA_BIND:-127.0.0.1}:3000:3000"]
    assert "prometheus" in grafana["depends_on"] and "prometheus" in COMPOSE["services"]
    mounts = dict(v.removesuffix(":ro").split(":", 1) for v in grafana["volumes"])
    assert all(v.endswith(":ro") for v in grafana["volumes"])
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"  # Grafana's default path
    (provider,) = yaml.safe_load(DASHBOARD_PROVIDERS.read_text())["providers"]
    assert provider["type"] == "file" and provider["options"]["path"] == mounts["./deploy/grafana/dashboards"]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home == f"{mounts['./deploy/grafana/dashboards']}/{DASHBOARD_FILE.name}"
    assert grafana["environment"]["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"


# Against a real Triton and gateway (and Prometheus, where installed).


def drive(http: httpx.Client) -> None:
    """A few answered requests on several routes, and a few failed ones (two error kinds)."""
    for path, body in (("/embed", {"inputs": ["what is a dashboard?", "a panel shows series"]}),
                       ("/rerank", {"model": "reranker", "query": "alerts", "texts": ["an alert fired", "nothing"]}),
                       ("/v1/embeddings", {"model": "minilm", "input": ["tokens per second"]})):
        response = http.post(path, json=body)
        assert response.status_code == 200, response.text
    assert http.post("/embed", json={"inputs": []}).status_code == 400  # empty
    assert http.post("/embed", json={"model": "no-such-model", "inputs": "x"}).status_code == 404  # not_found


@contextmanager
def prometheus(tmp_path: Path, gateway_url: str, triton_metrics_url: str) -> Iterator[str]:
    """deploy/prometheus.yml's jobs pointed at the test's gateway and Triton, scraped every second,
    the alert rules evaluated every second; stopped by PID on exit."""
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    shutil.copy2(ALERTS, tmp_path / "alerts.yml")
    config["rule_files"] = [str(tmp_path / "alerts.yml")]
    targets = {"gateway": urllib.parse.urlsplit(gateway_url).netloc,
               "triton": urllib.parse.urlsplit(triton_metrics_url).netloc}
    assert {job["job_name"] for job in config["scrape_configs"]} == set(targets)
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": [targets[job["job_name"]]]}]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    url = f"http://127.0.0.1:{free_port()}"
    with open(tmp_path / "prometheus.log", "wb") as log:
        process = subprocess.Popen([shutil.which("prometheus"), f"--config.file={tmp_path / 'prometheus.yml'}",
                                    f"--storage.tsdb.path={tmp_path / 'data'}",
                                    f"--web.listen-address={url.removeprefix('http://')}"],
                                   stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2):  # noqa: S310
                    break
            except OSError:
                assert time.monotonic() < deadline, "Prometheus did not get ready"
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def query(url: str, expr: str) -> dict:
    return get_json(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}")


def series_of(url: str, expr: str) -> list[dict]:
    result = query(url, expr)
    assert result["status"] == "success", (expr, result)
    return result["data"]["result"]


@pytest.fixture(scope="module")
def stack(triton) -> Iterator[tuple[httpx.Client, SupervisorMetrics]]:
    """A gateway with a supervisor's counters, one model's reload series labelled (it appears at its
    first use), and some traffic through it."""
    supervisor = SupervisorMetrics()
    supervisor.reloads.labels("minilm_tokenize")
    settings = GatewaySettings(triton_url=triton.grpc_url, repo=triton.options.repo, default_model="minilm")
    with running_gateway(settings, [supervisor.registry]) as gateway, httpx.Client(base_url=gateway, timeout=60) as http:
        drive(http)
        yield http, supervisor


def rule_expr(alert: str) -> str:
    (expr,) = [r["expr"] for r in alert_rules() if r["alert"] == alert]
    return expr


@pytest.mark.triton
def test_dashboard_and_alerts_use_series_triton_and_the_gateway_export(triton, stack):
    http, _ = stack
    gateway_text = http.get("/metrics").text
    triton_text = urllib.request.urlopen(triton.metrics_url, timeout=5).read().decode()  # noqa: S310
    assert not set(exported(triton_text)) & set(exported(gateway_text))
    series = {**exported(triton_text), **exported(gateway_text)}
    expressions = {**dashboard_queries(), **{f"alert {r['alert']}": r["expr"] for r in alert_rules()}}
    for where, expr in expressions.items():
        names = set(METRIC_NAME.findall(expr))
        missing = names - set(series)
        assert not missing, f"{where}: neither Triton nor the gateway exports {sorted(missing)}"
        for label in labels_named(expr):
            assert any(label in series[n] for n in names), f"{where}: no series of {sorted(names)} has `{label}`"
    for definition in variable_queries():
        name, label = re.fullmatch(r"label_values\((\w+), (\w+)\)", definition).groups()
        assert label in series[name], definition
    used = {n for expr in expressions.values() for n in METRIC_NAME.findall(expr)}
    assert {"prensa_triton_restarts_total", "prensa_stage_reloads_total"} <= used
    assert {n.split("_")[0] for n in used} == {"te", "prensa", "nv"}


@pytest.mark.triton
@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="Debian's `prometheus` is not installed (`make setup` installs it as root)")
def test_a_real_prometheus_runs_every_dashboard_query_and_alert_rule(triton, stack, tmp_path):
    http, supervisor = stack
    with prometheus(tmp_path, str(http.base_url), triton.metrics_url) as url:
        queries = {where: substituted(expr) for where, expr in dashboard_queries().items()}
        empty = list(queries)
        deadline = time.monotonic() + 30
        while empty and time.monotonic() < deadline:  # rates need two scrapes of each series
            drive(http)
            time.sleep(0.5)
            empty = [where for where, expr in queries.items() if not series_of(url, expr)]
        assert not empty, f"dashboard queries without data: {empty}"
        for job in ("gateway", "triton"):
            (up,) = series_of(url, f'up{{job="{job}"}}')
            assert up["value"][1] == "1", job

        # Every alert expression parses and runs (a parse error is a 400 with status "error").
        for rule in alert_rules():
            series_of(url, rule["expr"])
        broken = query(url, "sum(rate(te_request_count[1m])")
        assert broken["status"] == "error" and broken["errorType"] == "bad_data"  # what a bad one looks like
        assert not series_of(url, rule_expr("PrensaModelNotReady"))
        assert not series_of(url, rule_expr("PrensaGatewayDown"))
        assert not series_of(url, rule_expr("PrensaStageReloaded"))

        # The supervisor restarts Triton and reloads a stage: both alerts' expressions see it.
        supervisor.restarts.inc()
        supervisor.reloads.labels("minilm_tokenize").inc()
        deadline = time.monotonic() + 15
        while not (series_of(url, rule_expr("PrensaTritonRestarted")) and series_of(url, rule_expr("PrensaStageReloaded"))):
            assert time.monotonic() < deadline, "the supervisor's alerts never saw the restart and the reload"
            time.sleep(0.5)
        assert [s["metric"]["model"] for s in series_of(url, rule_expr("PrensaStageReloaded"))] == ["minilm_tokenize"]

        # And Prometheus itself loaded every rule and evaluates it without error.
        deadline = time.monotonic() + 15
        while True:
            loaded = [r for g in get_json(f"{url}/api/v1/rules")["data"]["groups"] for r in g["rules"]]
            if (loaded and all(r["health"] == "ok" for r in loaded)) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert sorted(r["name"] for r in loaded) == sorted(r["alert"] for r in alert_rules())
        assert all(r["health"] == "ok" for r in loaded), [(r["name"], r.get("lastError")) for r in loaded]
