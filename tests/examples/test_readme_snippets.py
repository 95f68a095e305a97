"""The README's Python, Go and TypeScript snippets are the example files, as they are.

Each such code block in README.md must equal one file under examples/ (the files CI runs:
tests/examples for Python, scripts/conformance.py for Go and TypeScript), and each quickstart
must be shown, so that what the README shows is what runs.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent.parent
README = ROOT / "README.md"
FENCE = re.compile(r"^```(python|go|ts)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
SUFFIX = {"python": ".py", "go": ".go", "ts": ".ts"}
QUICKSTARTS = [
    ROOT / "examples" / "python" / "quickstart.py",
    ROOT / "examples" / "go" / "quickstart" / "main.go",
    ROOT / "examples" / "ts" / "quickstart.ts",
]


def example_files() -> list[Path]:
    """The files a README snippet may show (not node_modules or build output)."""
    examples = ROOT / "examples"
    return sorted(
        [
            *examples.glob("python/*.py"),
            *examples.glob("go/*/main.go"),
            *examples.glob("ts/*.ts"),
        ]
    )


def readme_snippets() -> list[tuple[str, str]]:
    """(language, text) of every Python, Go and TypeScript block in the README."""
    return [(found.group(1), found.group(2)) for found in FENCE.finditer(README.read_text())]


def closest_file_diff(language: str, snippet: str) -> str:
    candidates = [path for path in example_files() if path.suffix == SUFFIX[language]]
    if not candidates:
        return f"(no {language} example files)"
    best = max(
        candidates,
        key=lambda path: difflib.SequenceMatcher(None, path.read_text(), snippet).ratio(),
    )
    diff = difflib.unified_diff(
        best.read_text().splitlines(),
        snippet.splitlines(),
        str(best.relative_to(ROOT)),
        "README.md",
        lineterm="",
    )
    return "\n".join(diff)


@pytest.mark.parametrize(
    ("language", "snippet"),
    [pytest.param(*found, id=f"{found[0]}-{n}") for n, found in enumerate(readme_snippets(), 1)],
)
def test_readme_snippet_is_an_example_file(language: str, snippet: str) -> None:
    shown = {path.read_text() for path in example_files()}
    assert snippet in shown, closest_file_diff(language, snippet)


@pytest.mark.parametrize("path", QUICKSTARTS, ids=lambda path: path.relative_to(ROOT).as_posix())
def test_readme_shows_the_quickstart(path: Path) -> None:
    shown = {snippet for _, snippet in readme_snippets()}
    assert path.read_text() in shown, f"README.md does not show {path.relative_to(ROOT)} as it is"


def test_readme_has_a_snippet_in_each_language() -> None:
    assert {language for language, _ in readme_snippets()} == {"python", "go", "ts"}
