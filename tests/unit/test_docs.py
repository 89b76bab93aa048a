"""The manual cannot drift from the code: docs/configuration.md lists exactly the options each
command has (flag, environment variable, default), every relative link in README.md and docs/
points at a file that exists, and the README stays a first page."""

from __future__ import annotations

import enum
import re
from pathlib import Path

import pytest
import typer

import prensa.cli

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CONFIGURATION = DOCS / "configuration.md"
README_MAX_LINES = 220

COMMAND_IN_HEADING = re.compile(r"`prensa ([a-z][a-z0-9 -]*?)`")
FLAG = re.compile(r"--[a-z0-9][a-z0-9-]*")
ARGUMENT = re.compile(r"`([A-Z][A-Z0-9_]*)`")
ENV = re.compile(r"PRENSA_[A-Z0-9_]+")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def leaf_commands() -> dict[str, object]:
    """Every runnable command by its full name ("repo build"), from the click tree typer builds."""
    found: dict[str, object] = {}

    def walk(command: object, path: list[str]) -> None:
        subcommands = getattr(command, "commands", None)
        if subcommands:
            for name, sub in subcommands.items():
                walk(sub, [*path, name])
        else:
            found[" ".join(path)] = command

    walk(typer.main.get_command(prensa.cli.app), [])
    return found


COMMANDS = leaf_commands()


def documented_rows() -> dict[str, list[list[str]]]:
    """Rows of the flag tables (header `| flag | env | default | meaning |`), per command: a `## `
    section naming several commands (`prensa gateway`, `prensa serve`, ...) counts for each."""
    rows: dict[str, list[list[str]]] = {}
    commands: list[str] = []
    in_flag_table = False
    for line in CONFIGURATION.read_text().splitlines():
        if line.startswith("## "):
            commands = COMMAND_IN_HEADING.findall(line)
            in_flag_table = False
            continue
        if not line.startswith("|"):
            in_flag_table = False
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells[0] == "flag":
            in_flag_table = True
            continue
        if in_flag_table and not set(cells[0]) <= set("-: "):
            for command in commands:
                rows.setdefault(command, []).append(cells)
    return rows


ROWS = documented_rows()


def options(command: object) -> list:
    return [p for p in command.params if p.param_type_name == "option"]


def arguments(command: object) -> list:
    return [p for p in command.params if p.param_type_name == "argument"]


def environment_variable(name: str, param) -> str:
    """The variable that sets an option: its own, else click's PRENSA_<COMMAND>_<OPTION> (or the
    prefix the command sets itself)."""
    prefix = COMMANDS[name].context_settings.get("auto_envvar_prefix")
    return param.envvar or "_".join([prefix or "PRENSA", *([] if prefix else name.upper().replace("-", "_").split()),
                                     param.name.upper()])


def default_spellings(param) -> set[str] | None:
    """How the default may be written, or None when the table's wording is free (flags, none, lists)."""
    value = param.default
    if getattr(param, "is_flag", False) or value is None or param.multiple or isinstance(value, (list, tuple)):
        return None
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, float) and value.is_integer():
        return {str(int(value)), str(value)}
    return {str(value)}


def test_every_command_is_documented():
    assert set(COMMANDS) - set(ROWS) == set(), "commands without a section in docs/configuration.md"
    assert set(ROWS) - set(COMMANDS) == set(), "docs/configuration.md documents commands that do not exist"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_configuration_lists_exactly_the_commands_options(name):
    command, rows = COMMANDS[name], ROWS.get(name, [])
    documented = {flag for row in rows for flag in FLAG.findall(row[0])}
    primary = {p.opts[0] for p in options(command) if p.opts[0] not in {"--install-completion", "--show-completion"}}
    spellings = {opt for p in options(command) for opt in (*p.opts, *p.secondary_opts)}
    assert primary - documented == set(), f"`prensa {name}` options missing from docs/configuration.md"
    assert documented - spellings == set(), f"docs/configuration.md lists options `prensa {name}` does not have"
    listed_arguments = {match for row in rows if not FLAG.search(row[0]) for match in ARGUMENT.findall(row[0])}
    assert listed_arguments == {p.name.upper() for p in arguments(command)}, f"`prensa {name}` arguments"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_configuration_gives_each_options_variable_and_default(name):
    by_flag = {opt: p for p in options(COMMANDS[name]) for opt in (*p.opts, *p.secondary_opts)}
    for row in ROWS.get(name, []):
        flags = FLAG.findall(row[0])
        if not flags:
            continue
        param = by_flag[flags[0]]
        env = ENV.findall(row[1])
        assert env == [environment_variable(name, param)], f"`prensa {name}` {flags[0]}: env column"
        spellings = default_spellings(param)
        if spellings is not None:
            cell = row[2].replace("`", "")
            assert any(re.search(rf"(?<![\w.]){re.escape(s)}(?![\w])", cell) for s in spellings), \
                f"`prensa {name}` {flags[0]}: default {param.default!r} not in {row[2]!r}"


def test_readme_is_a_first_page():
    lines = README.read_text().splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines; move details into docs/"


def without_code_blocks(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.DOTALL)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to
    hyphens, `-1`, `-2` ... for repeats."""
    seen: dict[str, int] = {}
    found = set()
    for line in without_code_blocks(page.read_text()).splitlines():
        if match := re.match(r"#{1,6} (.+)", line):
            slug = re.sub(r"[^\w\- ]", "", match[1].strip().lower()).replace(" ", "-")
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


@pytest.mark.parametrize("page", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve(page):
    """Every relative link points at a file that exists and, with `#anchor`, at one of its headings."""
    broken = []
    for target in LINK.findall(without_code_blocks(page.read_text())):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
            broken.append(target)
    assert broken == [], f"{page.name} has links to files or sections that do not exist"
