"""`buf curl` against the HTTP listener with no `--schema`: the real buf binary (the `buf-bin`
development dependency) asks the listener's server reflection, a bidirectional stream it
sends over cleartext HTTP/2 (h2c, prior knowledge), in the protocol of the call (Connect by
default, gRPC, gRPC-Web), then makes the call."""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer
from tests.service.auth_helpers import auth_settings, serving
from tests.service.conftest import make_settings
from tests.sqlite import sqlite_at

LIST_AGENTS = "agio.v1.AgentService/ListAgents"


def buf_binary() -> str:
    """The buf of the environment the tests run in (a development dependency: never absent)."""
    found = shutil.which("buf", path=str(Path(sys.executable).parent)) or shutil.which("buf")
    assert found is not None, "buf is a development dependency (buf-bin): run uv sync"
    return found


async def buf_curl(*arguments: str) -> tuple[int, str, str]:
    """`buf curl ARGUMENTS`: exit code, stdout, stderr. Run as a subprocess of the event loop
    that serves the listener, so that it is served meanwhile."""
    process = await asyncio.create_subprocess_exec(
        buf_binary(),
        "curl",
        "--connect-timeout",
        "20",
        *arguments,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(120):
        out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.fixture
async def http_app(tmp_path: Path, fake_model: FakeModelServer) -> AsyncIterator[AgioApp]:
    settings = make_settings(
        sqlite_at(tmp_path / "agio.db"),
        fake_model.base_url,
        http_address="127.0.0.1:0",
    )
    async with serving(settings) as app:
        yield app


def base_url(app: AgioApp) -> str:
    assert app.http is not None
    return f"http://{app.http.address}"


def agent_names(output: str) -> list[str]:
    return [agent["name"] for agent in json.loads(output)["agents"]]


@pytest.mark.parametrize(
    "options",
    [
        [],
        ["--http2-prior-knowledge"],
        ["--protocol", "grpc"],
        ["--protocol", "grpcweb"],
    ],
    ids=["connect", "connect-h2-prior-knowledge", "grpc", "grpc-web"],
)
async def test_buf_curl_calls_the_http_listener_by_reflection_without_a_schema(
    http_app: AgioApp, options: list[str]
) -> None:
    code, out, err = await buf_curl(*options, f"{base_url(http_app)}/{LIST_AGENTS}")
    assert code == 0, err
    assert agent_names(out) == ["assistant"]


async def test_buf_curl_lists_the_services_the_http_listener_reflects(http_app: AgioApp) -> None:
    code, out, err = await buf_curl("--list-services", base_url(http_app))
    assert code == 0, err
    assert out.split() == [
        "agio.v1.AgentService",
        "agio.v1.SessionService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    ]


async def test_buf_curl_streams_a_run_from_the_http_listener(http_app: AgioApp) -> None:
    code, out, err = await buf_curl(
        "--data",
        json.dumps({"input": "What is 12 * 7?"}),
        f"{base_url(http_app)}/agio.v1.AgentService/Run",
    )
    assert code == 0, err
    events: list[dict[str, Any]] = [
        json.loads(document) for document in out.replace("}\n{", "}\x00{").split("\x00")
    ]
    assert "runStarted" in events[0]
    assert events[-1]["runCompleted"]["run"]["stopSignal"]["reason"] == "STOP_REASON_COMPLETED"
    texts = [event["stepDelta"].get("content", "") for event in events if "stepDelta" in event]
    assert "84" in "".join(texts)


async def test_with_reflection_off_buf_curl_needs_a_schema(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    """Reflection follows `server.reflection` on both listeners (off by default when callers
    authenticate)."""
    settings = auth_settings(
        sqlite_at(tmp_path / "agio.db"),
        fake_model.base_url,
        http_address="127.0.0.1:0",
        server={"reflection": False},
    )
    async with serving(settings) as app:
        code, _, err = await buf_curl(f"{base_url(app)}/{LIST_AGENTS}")
    assert code != 0
    assert 'failed to find service named "agio.v1.AgentService"' in err, err


@pytest.fixture(autouse=True)
def no_error_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """The listener serves every request of these tests without logging an error (a broken
    HTTP/2 connection would log its traceback)."""
    yield
    errors = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert not errors, [record.getMessage() for record in errors]
