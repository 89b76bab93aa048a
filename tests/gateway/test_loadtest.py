"""`prensa loadtest [SCENARIO]` (the step load, locust headless) against a real gateway and Triton:
every step is summarised from locust's own history and Triton's metrics, with no failure."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from prensa.cli import app


def test_a_short_step_load_is_summarised_per_step(gateway, triton, tmp_path):
    result = CliRunner().invoke(app, ["loadtest", "embed", "--host", gateway, "--metrics-url", triton.metrics_url,
                                      "--steps", "2", "--step-seconds", "4", "--step-users", "2", "--model", "minilm",
                                      "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "loadtest.json").read_text())
    assert [step["users"] for step in summary] == [2, 4]
    for step in summary:
        assert step["requests_per_s"] > 0 and step["failures_per_s"] == 0
        assert step["encoders"], "Triton's metrics were not scraped"
    assert (tmp_path / "loadtest.png").stat().st_size > 10_000
