"""Every option of every command is also an environment variable: the serving commands' own
`PRENSA_<FLAG>`, the others' `PRENSA_<COMMAND>_<FLAG>` (click's automatic variables)."""

from __future__ import annotations

from typer.testing import CliRunner

from prensa.cli import app


def test_a_repo_build_option_from_its_variable(served, tmp_path):
    export = served.exports["embed"]
    result = CliRunner().invoke(app, ["repo", "build", f"embed={export}", "--repo", str(tmp_path / "from-env")],
                                env={"PRENSA_REPO_BUILD_MAX_BATCH_SIZE": "17"})
    assert result.exit_code == 0, result.output
    assert "max_batch_size: 17" in (tmp_path / "from-env" / "embed_encode" / "config.pbtxt").read_text()
    flag_wins = CliRunner().invoke(app, ["repo", "build", f"embed={export}", "--repo", str(tmp_path / "from-flag"),
                                         "--max-batch-size", "9"], env={"PRENSA_REPO_BUILD_MAX_BATCH_SIZE": "17"})
    assert flag_wins.exit_code == 0, flag_wins.output
    assert "max_batch_size: 9" in (tmp_path / "from-flag" / "embed_encode" / "config.pbtxt").read_text()
