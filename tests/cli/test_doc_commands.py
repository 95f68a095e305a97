"""The command lines README.md and docs/ show: each one the `agio-grpc` parser takes as
written (less its optional `[...]` parts and `...`), and every page that shows them says
where the command is, since `make serve` does not put it on PATH."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from agio_grpc.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCK = re.compile(r"^```(?:sh|bash|console)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
OPTIONAL = re.compile(r"\[[^\]]*\]")
ASSIGNMENT = re.compile(r"^\w+=\S*$")
COMMAND = {"agio-grpc", "$agio"}
WHERE_IT_IS = ".venv/bin/agio-grpc"


def command_lines(page: Path) -> list[tuple[str, list[str]]]:
    """The `agio-grpc` command lines of a page's shell blocks (continuations joined), each
    with its arguments."""
    found: list[tuple[str, list[str]]] = []
    for block in SHELL_BLOCK.finditer(page.read_text()):
        for line in block.group(1).replace("\\\n", " ").splitlines():
            words = shlex.split(OPTIONAL.sub("", line.removeprefix("$ ")), comments=True)
            while words and ASSIGNMENT.match(words[0]):
                words.pop(0)  # VARIABLE=value before the command
            if words and words[0] in COMMAND:
                found.append((line, [word for word in words[1:] if word != "..."]))
    return found


SHOWN = [(page, line, args) for page in PAGES for line, args in command_lines(page)]


def test_the_pages_show_command_lines() -> None:
    pages = {page.name for page, _, _ in SHOWN}
    assert {"README.md", "security.md", "tls.md", "deploy.md"} <= pages


@pytest.mark.parametrize(
    ("page", "line", "args"), SHOWN, ids=[f"{page.name}: {line}" for page, line, _ in SHOWN]
)
def test_a_command_line_a_page_shows_parses(
    page: Path, line: str, args: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # files it names are the repository's (examples/weather.json)
    try:
        build_parser().parse_args(args)
    except SystemExit:
        pytest.fail(f"{page.name} shows a command agio-grpc refuses: {line}")


@pytest.mark.parametrize("page", sorted({page for page, _, _ in SHOWN}), ids=lambda page: page.name)
def test_a_page_showing_commands_says_where_agio_grpc_is(page: Path) -> None:
    assert WHERE_IT_IS in page.read_text(), f"{page.name} should say where agio-grpc is"
