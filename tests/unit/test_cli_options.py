"""`prensa gateway`, `serve` and `up` offer the same gateway options (flags, PRENSA_* variables,
defaults), one per GatewaySettings field, and what they receive reaches the settings they serve with;
`repo build` and `bench` take theirs from ServingOptions the same way. No Triton: the functions that
would serve, build or measure are replaced by ones that record their arguments."""

from __future__ import annotations

import importlib
import inspect
from dataclasses import fields
from enum import Enum
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from prensa.cli import app
from prensa.cli.gateway import GatewayAddress
from prensa.cli.options import parameter_name
from prensa.gateway.core.limits import connection_ceiling
from prensa.gateway.http.connection import GatewayProtocol
from prensa.gateway.server import worker_server
from prensa.gateway.settings import GatewaySettings
from prensa.options import command_flag, flag_name, flag_of
from prensa.triton.repo import ServingOptions, Target

# `prensa.cli` exports the command functions under the modules' names, hence import_module.
gateway_cli = importlib.import_module("prensa.cli.gateway")
serve_cli = importlib.import_module("prensa.cli.serve")

COMMANDS = typer.main.get_command(app).commands
GATEWAY_ONLY = {"--triton-url", "--repo"}  # serve and up point the gateway at their own Triton and --repo
BESIDE_TRITON = {"--host": "--gateway-host", "--port": "--gateway-port"}  # serve's --host is Triton's


def options(command: str) -> dict[str, Any]:
    """The command's options by their first flag."""
    return {param.opts[0]: param for param in COMMANDS[command].params}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    """No PRENSA_* variable of the caller's shell may leak into these commands."""
    for command in ("gateway", "serve", "up"):
        for param in COMMANDS[command].params:
            monkeypatch.delenv(param.envvar, raising=False)


@pytest.mark.parametrize("command", ["serve", "up"])
def test_serve_and_up_offer_every_gateway_option(command):
    offered = options(command)
    for flag, option in options("gateway").items():
        if flag in GATEWAY_ONLY:
            continue
        twin = offered.get(BESIDE_TRITON.get(flag, flag))
        assert twin is not None, f"`prensa {command}` lacks {flag}"
        assert (twin.secondary_opts, twin.envvar, twin.default, twin.multiple) == \
            (option.secondary_opts, option.envvar, option.default, option.multiple), flag
    assert offered["--repo"].envvar == options("gateway")["--repo"].envvar  # the same directory


@pytest.mark.parametrize("command", ["gateway", "serve", "up"])
def test_every_option_reads_its_own_prensa_variable(command):
    envvars = [param.envvar for param in COMMANDS[command].params]
    assert all(isinstance(name, str) and name.startswith("PRENSA_") for name in envvars), envvars
    assert len(set(envvars)) == len(envvars)
    renamed = BESIDE_TRITON if command == "gateway" else {}
    for flag, option in options(command).items():
        assert option.envvar == "PRENSA_" + renamed.get(flag, flag)[2:].replace("-", "_").upper()


def test_gateway_options_are_the_settings_fields():
    """A new GatewaySettings field without a flag (or a flag without a field) fails here."""
    address = {item.name for item in fields(GatewayAddress)}
    settings = {parameter_name(item) for item in fields(GatewaySettings)}
    assert {param.name for param in COMMANDS["gateway"].params} == settings | address
    for command in ("serve", "up"):
        names = {param.name for param in COMMANDS[command].params}
        assert settings - {"triton_url", "repo"} | {f"gateway_{name}" for name in address} <= names, command


def test_help_shows_defaults_and_variables():
    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "PRENSA_API_KEY" in result.output and "PRENSA_MAX_CLIENT_BATCH_SIZE" in result.output
    assert "[default: 32]" in result.output


@pytest.fixture
def served(monkeypatch, tmp_path) -> list[dict[str, Any]]:
    """Each serving call's arguments by name, instead of serving: run_triton for serve and up (up's
    export and build replaced too), gateway_server for `prensa gateway`."""
    calls: list[dict[str, Any]] = []
    real = inspect.signature(serve_cli.run_triton)
    monkeypatch.setattr(serve_cli, "run_triton", lambda *a, **kw: calls.append(dict(real.bind(*a, **kw).arguments)))
    monkeypatch.setattr(gateway_cli, "gateway_server",
                        lambda settings, host, port: calls.append(
                            {"settings": settings, "gateway": GatewayAddress(host, port)}))
    monkeypatch.setattr(gateway_cli, "run_server", lambda server: True)
    monkeypatch.setattr("prensa.manifest.Manifest.read", lambda path: None)
    monkeypatch.setattr("prensa.triton.repo.build_repository", lambda sources, repo, options: ["tiny"])
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    (tmp_path / "models" / "tiny" / "prensa.json").write_text("{}")  # an export `up` reuses
    return calls


def arguments(command: str, tmp_path: Path) -> list[str]:
    """What each command needs besides gateway options to get as far as serving."""
    return {"gateway": [], "serve": ["--repo", str(tmp_path)],
            "up": ["--models-dir", str(tmp_path / "models"), "--model", "tiny=unused", "--repo", str(tmp_path / "repo")]}[command]


@pytest.mark.parametrize("command", ["gateway", "serve", "up"])
def test_defaults_are_the_settings_defaults(command, served, tmp_path):
    result = CliRunner().invoke(app, [command, *arguments(command, tmp_path)])
    assert result.exit_code == 0, result.output
    [call] = served
    assert call["settings"] == GatewaySettings()
    assert call["gateway"] == GatewayAddress()


@pytest.mark.parametrize("command", ["gateway", "serve", "up"])
def test_flags_and_variables_reach_the_settings(command, served, tmp_path):
    port = "--port" if command == "gateway" else "--gateway-port"
    result = CliRunner().invoke(
        app, [command, *arguments(command, tmp_path), "--api-key", "K", "--cors-allow-origin", "https://a.example",
              "--cors-allow-origin", "https://b.example", "--no-auto-truncate", port, "9999"],
        env={"PRENSA_MAX_CLIENT_BATCH_SIZE": "7", "PRENSA_DEFAULT_PROMPT_NAME": "query",
             "PRENSA_SPLIT_LARGE_BATCHES": "true", "PRENSA_GATEWAY_HOST": "0.0.0.0"})
    assert result.exit_code == 0, result.output
    [call] = served
    assert call["settings"] == GatewaySettings(
        api_key="K", max_client_batch_size=7, default_prompt_name="query", split_large_batches=True,
        auto_truncate=False, cors_allow_origins=("https://a.example", "https://b.example"))
    assert call["gateway"] == GatewayAddress("0.0.0.0", 9999)


def test_gateway_takes_its_triton_and_repo_from_flags_or_variables(served):
    result = CliRunner().invoke(app, ["gateway", "--repo", "elsewhere"], env={"PRENSA_TRITON_URL": "a:1,b:2"})
    assert result.exit_code == 0, result.output
    assert served[0]["settings"] == GatewaySettings(triton_url="a:1,b:2", repo=Path("elsewhere"))


def test_serve_takes_its_own_options_from_variables(served, tmp_path):
    result = CliRunner().invoke(app, ["serve"], env={"PRENSA_REPO": str(tmp_path), "PRENSA_GRPC_PORT": "9001",
                                                     "PRENSA_RESTART_LIMIT": "0", "PRENSA_GATEWAY": "false"})
    assert result.exit_code == 0, result.output
    [call] = served
    assert (call["options"].repo, call["options"].ports.grpc, call["policy"].limit) == (tmp_path, 9001, 0)
    assert call["gateway"] is None


@pytest.mark.parametrize("given", [["--default-prompt", "query: ", "--default-prompt-name", "query"],
                                   ["--default-prompt-name", "query"]])
def test_a_prompt_and_a_prompt_name_exclude_each_other(given, served):
    result = CliRunner().invoke(app, ["gateway", *given], env={"PRENSA_DEFAULT_PROMPT": "query: ", "COLUMNS": "200"})
    assert result.exit_code == 2
    assert "'--default-prompt-name' / '--default-prompt'" in result.output
    assert not served


@pytest.mark.parametrize("command", ["gateway", "serve", "up"])
@pytest.mark.parametrize("given", [["--api-key", ""], ["--api-key", "  "], []])
def test_an_empty_api_key_is_refused(command, given, served, tmp_path):
    """Also from PRENSA_API_KEY= (set, empty), which click alone would read as no key at all."""
    env = {"COLUMNS": "200"} | ({} if given else {"PRENSA_API_KEY": ""})
    result = CliRunner().invoke(app, [command, *arguments(command, tmp_path), *given], env=env)
    assert result.exit_code == 2, result.output
    assert "an empty API key would turn authentication off" in " ".join(result.output.split())
    assert not served


def test_a_key_flag_wins_over_an_empty_variable(served):
    result = CliRunner().invoke(app, ["gateway", "--api-key", "K"], env={"PRENSA_API_KEY": ""})
    assert result.exit_code == 0, result.output
    assert served[0]["settings"].api_key == "K"


def test_connection_limits_reach_the_settings(served):
    result = CliRunner().invoke(app, ["gateway", "--max-connections", "100", "--request-read-timeout", "5"],
                                env={"PRENSA_WRITE_TIMEOUT": "7", "PRENSA_MAX_HEADER_SIZE": "9000",
                                     "PRENSA_GRACEFUL_TIMEOUT": "2.5"})
    assert result.exit_code == 0, result.output
    assert served[0]["settings"] == GatewaySettings(max_connections=100, request_read_timeout_s=5,
                                                    write_timeout_s=7, max_header_size=9000, graceful_timeout_s=2.5)


def test_the_server_gets_the_grace_period_and_the_guarded_protocol():
    config = worker_server(GatewaySettings(graceful_timeout_s=2.5, max_connections=10, max_header_size=9000),
                           "127.0.0.1", 0).config
    assert config.timeout_graceful_shutdown == 2.5
    assert issubclass(config.http, GatewayProtocol)
    assert (config.http.limits.max_connections, config.http.limits.max_header_size) == (10, 9000)
    capped = worker_server(GatewaySettings(max_connections=10**9), "127.0.0.1", 0).config
    assert capped.http.limits.max_connections == connection_ceiling()  # never above the descriptor limit


def test_flags_print_no_type_and_completion_reads_no_prensa_variable():
    """typer would print `<bool>` beside each flag and let PRENSA_INSTALL_COMPLETION=1 install a
    shell completion on any run of `prensa`; the console script's command does neither."""
    from click.testing import CliRunner as ClickRunner

    from prensa.cli import command_line

    runner = ClickRunner()
    for command in (["bench", "compare"], ["gateway"], ["export"], ["repo", "build"]):
        shown = runner.invoke(command_line(), [*command, "--help"], terminal_width=200)
        assert shown.exit_code == 0 and "--no-" in shown.output and "<bool>" not in shown.output, command
    assert "<bool>" in runner.invoke(typer.main.get_command(app), ["bench", "compare", "--help"], terminal_width=200).output
    result = runner.invoke(command_line(), ["--help"], env={"PRENSA_INSTALL_COMPLETION": "1",
                                                             "PRENSA_SHOW_COMPLETION": "1"})
    assert result.exit_code == 0 and "Usage" in result.output and "completion installed" not in result.output


def test_repo_build_options_are_the_serving_options_fields():
    """Each flagged ServingOptions field is one `repo build` option with the field's default (a
    field the class adds reaches the command, and no default is written twice)."""
    offered = {param.name: param for param in COMMANDS["repo"].commands["build"].params}
    for item in fields(ServingOptions):
        if flag_of(item) is None:
            assert parameter_name(item) not in offered, item.name
            continue
        param = offered[parameter_name(item)]
        expected = None if command_flag(item).parse else item.default
        assert param.default == (expected.value if isinstance(expected, Enum) else expected), item.name
        assert param.opts[0] == flag_name(item)


@pytest.fixture
def built(monkeypatch) -> list[ServingOptions]:
    """The options each `repo build` or `bench` run would use, instead of building or measuring."""
    bench_cli = importlib.import_module("prensa.cli.bench")
    repo_cli = importlib.import_module("prensa.cli.repo")
    calls: list[ServingOptions] = []
    monkeypatch.setattr(repo_cli, "build_repository", lambda models, repo, options: calls.append(options) or [])
    monkeypatch.setattr(repo_cli, "parse_model_arg",
                        lambda argument, name: SimpleNamespace(name=argument.partition("=")[0]))
    monkeypatch.setattr(bench_cli, "require", lambda *args: None)
    monkeypatch.setattr(bench_cli, "Manifest", SimpleNamespace(read=lambda path: SimpleNamespace(source="none")))
    monkeypatch.setattr(bench_cli, "run_bench", lambda options, step: calls.append(options.serving) or {})
    monkeypatch.setattr(bench_cli, "add_ratios", lambda report: (_ for _ in ()).throw(typer.Exit(0)))
    return calls


def test_repo_build_hands_its_flags_to_the_serving_options(built):
    result = CliRunner().invoke(app, ["repo", "build", "unused", "--instances", "3", "--target", "container",
                                      "--length-buckets", "16,64", "--no-response-cache"],
                                env={"PRENSA_REPO_BUILD_QUEUE_DELAY_US": "250"})
    assert result.exit_code == 0, result.output
    assert built == [ServingOptions(encode_instances=3, target=Target.CONTAINER, length_buckets=(16, 64),
                                    queue_delay_us=250)]


def test_repo_build_refuses_a_name_that_would_read_as_a_version(built):
    result = CliRunner().invoke(app, ["repo", "build", "minilm@2=/exports/minilm"], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "`@` pins a version: minilm@2" in result.output, result.output
    assert built == [], "nothing is written"


def test_bench_takes_the_serving_options_it_names(built, tmp_path):
    result = CliRunner().invoke(app, ["bench", str(tmp_path), "--out", str(tmp_path), "--cpu-threads", "2"],
                                env={"PRENSA_BENCH_INSTANCES": "2"})
    assert result.exit_code == 0, result.output
    assert built == [ServingOptions(encode_instances=2, cpu_threads=2)]


@pytest.mark.parametrize(("given", "named"), [
    (["--instances", "0"], "'--instances'"),
    (["--max-queue-size", "-1"], "'--max-queue-size'"),
    (["--length-buckets", "16,sixty"], "'--length-buckets'"),
    (["--length-buckets", "16"], "--target container"),
])
def test_a_serving_option_no_repository_can_serve_is_a_usage_error(given, named, built):
    result = CliRunner().invoke(app, ["repo", "build", "unused", *given], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert named in result.output
    assert not built
