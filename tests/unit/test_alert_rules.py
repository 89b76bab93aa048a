"""deploy/prometheus/alerts.yml under promtool: the rules load, fire on the series of
tests/unit/alert_rules_test.yml and stay silent on healthy ones; every alert's firing and its silence
are asserted there (each mutated into never-firing and always-firing, the unit tests must fail);
and deploy/prometheus.yml, with the rules where compose.yaml mounts them, is a valid config.
promtool comes from Debian's prometheus package (`make test` installs it where it can); without it
the promtool tests are skipped, saying so. The Makefile's install logic is checked with a fake PATH."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from prensa.gateway.errors import ERROR_TABLE, ErrorKind

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
RULE_TESTS = Path(__file__).with_name("alert_rules_test.yml")
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus.yml"
MOUNTED_ALERTS = "/etc/prometheus/alerts.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian's prometheus package; `make test` installs it as root)")


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, cwd=cwd, timeout=60)


@needs_promtool
def test_alert_rules_load():
    result = promtool("check", "rules", str(ALERTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


@needs_promtool
def test_alerts_fire_on_bad_series_and_stay_silent_on_healthy_ones():
    result = promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_alert_is_expected_to_fire_somewhere_and_to_stay_silent_somewhere():
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert tests["rule_files"] == ["../../deploy/prometheus/alerts.yml"]
    assert (RULE_TESTS.parent / tests["rule_files"][0]).resolve() == ALERTS
    cases = [case for test in tests["tests"] for case in test["alert_rule_test"]]
    healthy = next(test for test in tests["tests"] if test["name"] == "healthy")
    silent_when_healthy = {case["alertname"] for case in healthy["alert_rule_test"] if not case["exp_alerts"]}
    for rule in rules():
        name = rule["alert"]
        assert any(c["alertname"] == name and c["exp_alerts"] for c in cases), f"{name} is never expected to fire"
        assert name in silent_when_healthy, f"{name} is not expected silent on the healthy series"


@needs_promtool
@pytest.mark.parametrize("mutant", ["vector(0) > 1", "vector(1)"], ids=["never-fires", "always-fires"])
def test_the_unit_tests_catch_each_alert_broken(tmp_path, mutant):
    """Each alert's expression replaced in turn by one that never (or always) fires: promtool's
    unit tests must fail for every one, naming that alert. So no alert passes them by accident."""
    document = yaml.safe_load(ALERTS.read_text())
    tests = yaml.safe_load(RULE_TESTS.read_text())
    for group_index, group in enumerate(document["groups"]):
        for rule_index, rule in enumerate(group["rules"]):
            broken = yaml.safe_load(ALERTS.read_text())
            broken["groups"][group_index]["rules"][rule_index]["expr"] = mutant
            rules_file = tmp_path / f"{rule['alert']}.yml"
            rules_file.write_text(yaml.safe_dump(broken))
            test_file = tmp_path / f"{rule['alert']}_test.yml"
            test_file.write_text(yaml.safe_dump({**tests, "rule_files": [str(rules_file)]}))
            result = promtool("test", "rules", str(test_file), cwd=tmp_path)
            assert result.returncode != 0, f"{rule['alert']} as `{mutant}` passes the unit tests"
            assert f"alertname: {rule['alert']}," in result.stdout + result.stderr, result.stdout


def test_every_alert_says_how_bad_and_what_for_whom():
    names = [rule["alert"] for rule in rules()]
    assert len(set(names)) == len(names)
    expected = {"PrensaGatewayDown", "PrensaHighErrorRatio", "PrensaGatewayQueueTimeHigh", "PrensaPermitsNearlyExhausted",
                "PrensaModelNotReady", "PrensaTritonMetricsDown", "PrensaTritonQueueTimeHigh",
                "PrensaTritonInferenceFailures", "PrensaTritonRestarted", "PrensaStageReloaded"}
    assert set(names) == expected
    for rule in rules():
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning"}, rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description"}, rule["alert"]
        # An alert on a per-model (or per-kind, per-target) series names it in what it says.
        for label in ("model", "err", "instance"):
            per_model_series = re.search(r"\bprensa_(model_ready|stage_reloads_total)\b", rule["expr"])
            if re.search(rf"\bby \([^)]*\b{label}\b", rule["expr"]) or (label == "model" and per_model_series):
                assert f"$labels.{label}" in rule["annotations"]["summary"], (rule["alert"], label)


def test_error_ratio_counts_exactly_the_server_side_error_kinds():
    """The kinds named in the rule exist in the gateway, and every 5xx kind is among them, plus
    backend (Triton failed: TEI's 424) and overloaded (429: the permits ran out)."""
    (rule,) = [r for r in rules() if r["alert"] == "PrensaHighErrorRatio"]
    (kinds,) = set(re.findall(r'err=~"([^"]+)"', rule["expr"]))
    named = set(kinds.split("|"))
    assert named <= {kind.value for kind in ErrorKind}
    server_side = {kind.value for kind, (status, _) in ERROR_TABLE.items() if status >= 500}
    assert named == server_side | {ErrorKind.BACKEND.value, ErrorKind.OVERLOADED.value}


def test_permits_alert_holds_each_gateway_to_the_limit_it_exports():
    """No --max-concurrent-requests written into the rule: the gateway's prensa_inputs_limit, matched
    per target (the unit tests give two gateways different limits), and the annotations quote it."""
    (rule,) = [r for r in rules() if r["alert"] == "PrensaPermitsNearlyExhausted"]
    assert re.search(r"\bprensa_inputs_in_flight\b.*>\s*0\.9 \* prensa_inputs_limit\b", rule["expr"])
    assert not re.search(r"\b512\b", rule["expr"] + rule["annotations"]["summary"] + rule["annotations"]["description"])
    assert all("prensa_inputs_limit" in text for text in rule["annotations"].values())


def test_prometheus_loads_the_rules_from_where_compose_mounts_them():
    config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    assert config["rule_files"] == [MOUNTED_ALERTS]
    compose = yaml.safe_load((ROOT / "compose.yaml").read_text())
    assert f"./deploy/prometheus/alerts.yml:{MOUNTED_ALERTS}:ro" in compose["services"]["prometheus"]["volumes"]


@needs_promtool
def test_prometheus_config_is_valid_with_its_rules(tmp_path):
    """promtool reads rule_files too; the mounted path exists only in the container, so the config is
    checked from a copy that points at the rules beside it."""
    shutil.copy2(ALERTS, tmp_path / "alerts.yml")
    text = PROMETHEUS_CONFIG.read_text()
    assert text.count(MOUNTED_ALERTS) == 1
    (tmp_path / "prometheus.yml").write_text(text.replace(MOUNTED_ALERTS, str(tmp_path / "alerts.yml")))
    result = promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout
    # And the real file fails only for the missing mount, not for anything else.
    result = promtool("check", "config", str(PROMETHEUS_CONFIG))
    assert result.returncode != 0 and f'"{MOUNTED_ALERTS}" does not point to an existing file' in result.stdout + result.stderr


# The Makefile's `promtool` prerequisite of `test`, run with a PATH of fakes.

MAKE = shutil.which("make")


def fake_bin(path: Path, uid: int, promtool: bool, apt_get: bool) -> Path:
    path.mkdir()
    (path / "id").write_text(f"#!/bin/sh\necho {uid}\n")
    if promtool:
        (path / "promtool").write_text("#!/bin/sh\nexit 0\n")
    if apt_get:  # records how it was called, and succeeds
        (path / "apt-get").write_text(f'#!/bin/sh\necho "DEBIAN_FRONTEND=$DEBIAN_FRONTEND $*" >> {path}/apt-get.log\n')
    for tool in path.iterdir():
        tool.chmod(0o755)
    return path


@pytest.mark.skipif(MAKE is None, reason="make is not installed")
@pytest.mark.parametrize("uid, has_promtool, has_apt, installs, says_skipped", [
    (0, True, True, False, False),  # already there: nothing to do, nothing said
    (0, False, True, True, False),  # root with apt-get: Debian's package
    (1000, False, True, False, True),  # not root: cannot install
    (0, False, False, False, True),  # no apt-get: cannot install
], ids=["present", "root-apt", "not-root", "no-apt"])
def test_make_installs_promtool_only_where_it_can(tmp_path, uid, has_promtool, has_apt, installs, says_skipped):
    bin_dir = fake_bin(tmp_path / "bin", uid, has_promtool, has_apt)
    result = subprocess.run([MAKE, "--no-print-directory", "-C", str(ROOT), "promtool"], capture_output=True, text=True,
                            env={"PATH": str(bin_dir), "HOME": str(tmp_path)}, timeout=60)
    assert result.returncode == 0, result.stderr
    log = bin_dir / "apt-get.log"
    if installs:
        assert log.read_text() == "DEBIAN_FRONTEND=noninteractive install -y -q --no-install-recommends prometheus\n"
    else:
        assert not log.exists()
    assert ("the promtool tests will be skipped" in result.stdout) == says_skipped, result.stdout
    assert result.stdout.count("\n") == (1 if says_skipped else 0), result.stdout


@pytest.mark.skipif(MAKE is None, reason="make is not installed")
def test_make_test_reaches_the_promtool_step():
    dry = subprocess.run([MAKE, "-n", "-C", str(ROOT), "test", f"VENV={ROOT / '.venv'}", "-o", f"{ROOT / '.venv'}/.installed"],
                         capture_output=True, text=True, env={**os.environ}, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "command -v promtool" in dry.stdout and "pytest" in dry.stdout
