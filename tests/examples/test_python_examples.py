"""The Python examples, run as a reader runs them, against a live server.

The server is the real one on 127.0.0.1:0 with its built-in fake model and a SQLite file;
each example runs as its own process with only `AGIO_ADDRESS` telling it where the server
is. (scripts/conformance.py runs the Go and TypeScript examples the same way.)
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agio_grpc.config import Settings
from agio_grpc.service.app import AgioApp
from tests.conformance.examples import quickstart_printed_names

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples" / "python"
EXAMPLE_TIMEOUT = 30.0


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[AgioApp]:
    """The service as `agio-grpc serve` starts it with no model configured."""
    settings = Settings(
        listen_address="127.0.0.1:0",
        database_url=f"sqlite+aiosqlite:///{tmp_path / 'agio.db'}",
        openai_base_url=None,
    )
    started = await AgioApp.start(settings)
    try:
        yield started
    finally:
        await started.stop(grace=0)


async def run_example(name: str, address: str) -> str:
    """The example's standard output; fails the test on a non-zero exit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGIO_")}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLES / name),
        env=env | {"AGIO_ADDRESS": address},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    output, errors = await asyncio.wait_for(process.communicate(), EXAMPLE_TIMEOUT)
    assert process.returncode == 0, errors.decode()
    return output.decode()


async def test_quickstart_prints_the_stop_reason_and_roles_by_name(app: AgioApp) -> None:
    output = await run_example("quickstart.py", app.address)
    assert quickstart_printed_names(output), output


async def test_background_run_follows_the_run_to_its_terminal_event(app: AgioApp) -> None:
    output = await run_example("background_run.py", app.address)
    first, *events = output.splitlines()
    assert re.fullmatch(r"run_\w+ RUN_STATUS_(RUNNING|QUEUED)", first), output
    printed = [(int(line.split()[0]), line.split()[1]) for line in events]
    # Followed live, every seq; a run that ended before the watch began is replayed from
    # its journal, which keeps no deltas: a seq may then be missing only where a step's
    # deltas were, between its step_started and its step_completed.
    for (seq, kind), (next_seq, next_kind) in itertools.pairwise(printed):
        assert next_seq > seq, output
        if next_seq > seq + 1:
            assert (kind, next_kind) == ("step_started", "step_completed"), output
    assert printed[0][0] == 1, output
    assert events[0].endswith(" run_started"), output
    assert events[-1].endswith(" run_completed"), output
