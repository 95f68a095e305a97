"""Fixtures for the CLI: the real server on 127.0.0.1:0 with the fake model (as the service
tests serve it), and `cli`, which runs `agio_grpc.cli.main` in-process against it."""

from __future__ import annotations

import asyncio
import io
from dataclasses import dataclass

import pytest

from agio_grpc.cli import main
from agio_grpc.service.app import AgioApp
from tests.service.conftest import app, client, fake_model

__all__ = ["Cli", "Result", "app", "cli", "client", "fake_model"]


@dataclass(frozen=True, slots=True)
class Result:
    code: int
    out: str
    err: str

    @property
    def last_line(self) -> str:
        return self.out.splitlines()[-1]


class TerminalInput(io.StringIO):
    """Typed-in lines: stdin as a terminal gives them."""

    def isatty(self) -> bool:
        return True


class Cli:
    """`agio-grpc ARGS --address SERVER`, run by `main` on a thread of its own (it runs its
    own event loop) while the server goes on serving on the test's loop."""

    def __init__(
        self, address: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        self.address = address
        self._capsys = capsys
        self._monkeypatch = monkeypatch

    async def __call__(
        self, *args: str, stdin: str = "", terminal: bool = False, address: bool = True
    ) -> Result:
        """Run with `stdin` as its input (a terminal's when `terminal`), `--address` added
        unless `address` is false."""
        self._capsys.readouterr()
        self._monkeypatch.setattr("sys.stdin", (TerminalInput if terminal else io.StringIO)(stdin))
        argv = [*args, "--address", self.address] if address else list(args)
        code = await asyncio.to_thread(_exit_code, argv)
        captured = self._capsys.readouterr()
        return Result(code, captured.out, captured.err)


def _exit_code(argv: list[str]) -> int:
    """`main`'s exit code, also when argparse exits (a usage error, `--help`)."""
    try:
        return main(argv)
    except SystemExit as exit:
        return int(exit.code or 0)


@pytest.fixture
def cli(app: AgioApp, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    return Cli(app.address, capsys, monkeypatch)
