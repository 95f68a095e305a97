"""MCP servers' tools called as a run calls them, against real MCP servers written with the
SDK: one over stdio, one over Streamable HTTP on 127.0.0.1 (one server process of each per
module; the tests that break a server start their own)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import os
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio

from agio_grpc.config import McpServerConfig
from agio_grpc.engine.mcp import TASK_SUPPORT_MISSING, McpServer, McpServers, McpServerSpec
from agio_grpc.service.mcp_setup import mcp_server_spec
from agio_grpc.telemetry import trace_log_handler
from tests.mcp.conftest import (
    HttpToolbox,
    Toolbox,
    connected,
    free_port,
    http_spec,
    http_toolbox,
    stdio_spec,
    wait_for,
)
from tests.mcp.reference import ReferenceServers

pytestmark = pytest.mark.asyncio(loop_scope="module")

LISTED_ENV = {"TOOLBOX_MODE": "test"}
GARBLED = Path(__file__).parent / "servers" / "garbled.py"


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpToolbox]:
    with http_toolbox(tmp_path_factory.mktemp("http") / "events.txt") as served:
        yield served


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["stdio", "http"])
async def toolbox(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    http_server: HttpToolbox,
) -> AsyncIterator[Toolbox]:
    if request.param == "stdio":
        events = tmp_path_factory.mktemp("stdio") / "events.txt"
        spec = stdio_spec(events, env=LISTED_ENV)
    else:
        events = http_server.events
        spec = http_spec(http_server.url)
    async with connected(spec, events) as box:
        yield box


@pytest_asyncio.fixture(loop_scope="module")
async def stdio_toolbox(tmp_path: Path) -> AsyncIterator[Toolbox]:
    """A stdio toolbox of the test's own, for tests that break it."""
    async with connected(stdio_spec(tmp_path / "events.txt"), tmp_path / "events.txt") as box:
        yield box


async def test_lists_tools_with_their_input_schemas(toolbox: Toolbox) -> None:
    tools = toolbox.server.tools()
    assert {"toolbox__hello", "toolbox__add", "toolbox__slow"} <= set(tools)
    add = tools["toolbox__add"]
    assert add.available
    assert add.source == "mcp:toolbox"
    assert add.parameters["required"] == ["a", "b"]
    assert add.parameters["properties"]["a"]["type"] == "integer"
    offered = toolbox.registry.definitions(["toolbox__add"])
    assert offered[0]["function"]["name"] == "toolbox__add"
    assert offered[0]["function"]["description"] == "Add two integers."


async def test_call_result_becomes_the_tool_message(toolbox: Toolbox) -> None:
    result = await toolbox.call("add", '{"a": 2, "b": 40}')
    assert not result.is_error
    assert json.loads(result.content) == {"sum": 42}
    assert result.origin is not None
    assert (result.origin.server, result.origin.remote_name) == ("toolbox", "add")
    assert result.origin.protocol_version
    # Streamable HTTP names its session (mcp.session.id on the span); stdio has none.
    assert bool(result.origin.session_id) == (result.origin.transport == "streamable-http")


async def test_is_error_result_is_a_tool_error(toolbox: Toolbox) -> None:
    result = await toolbox.call("fail", '{"reason": "the disk is full"}')
    assert result.is_error
    assert "the disk is full" in result.content


async def test_arguments_are_checked_against_the_input_schema(toolbox: Toolbox) -> None:
    result = await toolbox.call("add", '{"a": "two", "b": 40}')
    assert result.is_error
    assert result.content.startswith("Error: invalid arguments for 'toolbox__add': a: ")
    assert result.origin is None  # refused before any call reached the server


async def test_unknown_tool_is_an_error_result(toolbox: Toolbox) -> None:
    result = await toolbox.call("no_such_tool")
    assert result.is_error
    assert "unknown tool 'toolbox__no_such_tool'" in result.content


async def test_images_are_described_by_type_and_size(toolbox: Toolbox) -> None:
    result = await toolbox.call("picture")
    assert result.content.splitlines()[:2] == ["a red dot", "[image: image/png, 8 bytes]"]


async def test_timeout_cancels_the_call_on_the_server(toolbox: Toolbox, tmp_path: Path) -> None:
    marker = f"timeout-{tmp_path.name}"
    result = await toolbox.call("slow", json.dumps({"marker": marker}), timeout_s=1.0)
    assert result.is_error
    assert "timed out after 1s" in result.content
    await wait_for(lambda: f"cancelled {marker}" in toolbox.events_seen(), "the cancellation")
    assert (await toolbox.call("hello")).content.startswith("hello from the toolbox")


async def test_run_cancellation_cancels_the_call_on_the_server(
    toolbox: Toolbox, tmp_path: Path
) -> None:
    marker = f"cancel-{tmp_path.name}"
    calling = asyncio.create_task(toolbox.call("slow", json.dumps({"marker": marker}), 60))
    await wait_for(lambda: f"started {marker}" in toolbox.events_seen(), "the call to start")
    calling.cancel()
    with pytest.raises(asyncio.CancelledError):
        await calling
    await wait_for(lambda: f"cancelled {marker}" in toolbox.events_seen(), "the cancellation")


async def test_list_changed_refreshes_the_tools(toolbox: Toolbox) -> None:
    assert (await toolbox.call("grow")).content.startswith("grown")
    await wait_for(lambda: "toolbox__extra" in toolbox.server.tools(), "the refreshed list")
    assert (await toolbox.call("extra")).content.startswith("extra")


async def test_stdio_server_gets_only_the_environment_its_entry_names(
    toolbox: Toolbox,
) -> None:
    if toolbox.server.spec.transport != "stdio":
        pytest.skip("an HTTP server's environment is not ours")
    names = set((await toolbox.call("environment")).content.splitlines())
    # Python itself sets LC_CTYPE when the locale is C (PEP 538).
    assert names - {"LC_CTYPE"} == set(LISTED_ENV)


def written(records: list[logging.LogRecord], *, capture_content: bool) -> str:
    """`records` as `agio-grpc serve` writes them."""
    handler = trace_log_handler(
        logging.StreamHandler(io.StringIO()), capture_content=capture_content
    )
    return "\n".join(handler.format(record) for record in records if handler.filter(record))


async def test_a_line_that_is_not_a_message_logs_no_content_unless_opted_in(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "the tool's secret heron"
    caplog.set_level(logging.DEBUG)
    spec = stdio_spec(tmp_path / "events.txt", name="garbled", args=(str(GARBLED),))
    async with connected(spec, tmp_path / "events.txt") as box:
        result = await box.call("garble", json.dumps({"text": secret}))
    assert (result.content, result.is_error) == ("garbled", False)
    (noted,) = [r for r in caplog.records if "transport error" in r.getMessage()]
    assert (noted.levelno, noted.name) == (logging.DEBUG, "agio_grpc.engine.mcp")
    assert secret not in noted.getMessage()
    assert "transport error" in written(caplog.records, capture_content=False)
    assert secret not in written(caplog.records, capture_content=False)
    assert secret in written(caplog.records, capture_content=True)


async def test_crash_mid_call_is_a_tool_error_then_the_server_restarts(
    stdio_toolbox: Toolbox,
) -> None:
    server = stdio_toolbox.server
    result = await stdio_toolbox.call("crash")
    assert result.is_error
    assert result.content == (
        "tool 'toolbox__crash' failed: MCP server 'toolbox' closed the connection during the "
        "call; it is being restarted"
    )
    await wait_for(lambda: server.connected and server.connections == 2, "the restart")
    assert (await stdio_toolbox.call("hello")).content.startswith("hello from the toolbox")


@pytest.mark.slow  # two more server processes, started one after the other
async def test_http_server_that_crashes_mid_call_is_reconnected_once_it_is_back(
    tmp_path: Path,
) -> None:
    events = tmp_path / "events.txt"
    port = free_port()
    # Both server processes end after the client closes (an open stream holds a server's
    # shutdown); they start in a thread, off the event loop the client runs on.
    with contextlib.ExitStack() as processes:
        served = processes.enter_context(http_toolbox(events, port))
        async with connected(http_spec(served.url, restart_max_s=0.5), events) as box:
            result = await box.call("crash")
            assert result.is_error
            assert "closed the connection during the call" in result.content
            assert await asyncio.to_thread(served.process.wait, 10) == 3
            # Its supervisor starts it again.
            await asyncio.to_thread(processes.enter_context, http_toolbox(events, port))
            await wait_for(lambda: box.server.connections == 2, "the reconnection")
            assert (await box.call("hello")).content.startswith("hello from the toolbox")


async def test_a_stdio_server_whose_process_dies_loses_its_tools_without_waiting_for_a_ping(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "agio_grpc.engine.mcp")
    # No ping and no restart comes within the test: only the watched process can tell.
    spec = stdio_spec(tmp_path / "events.txt", ping_interval_s=3600, restart_initial_s=3600)
    async with connected(spec, tmp_path / "events.txt") as box:
        hello = box.server.tools()["toolbox__hello"]
        assert box.registry.definitions(["toolbox__hello"]) != []
        pid = int((await box.call("pid")).content.splitlines()[0])
        os.kill(pid, signal.SIGKILL)
        await wait_for(lambda: not hello.available, "the death to be noticed")
        assert box.registry.definitions(["toolbox__hello"]) == []  # no longer offered
        await wait_for(lambda: "signal" in hello.unavailable_reason, "the exit to be known")
        assert hello.unavailable_reason == (
            "MCP server 'toolbox' is not connected (its process was killed by signal SIGKILL)"
        )
        result = await box.call("hello")
        assert result.is_error
        assert "MCP server 'toolbox' is restarting" in result.content
        # The watcher marks the tools unavailable at once; the owner task logs the stop once
        # the connection has unwound, which a server stopped before then never does.
        await wait_for(lambda: bool(warnings(caplog)), "the stop to be logged")
    assert warnings(caplog) == [
        f"mcp server toolbox stopped: {sys.executable} was killed by signal SIGKILL; its tools "
        "are unavailable, reconnecting in 3600s"
    ]


async def test_a_server_that_fails_to_start_logs_its_program_exit_code_and_last_stderr_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "agio_grpc.engine.mcp")
    script = (
        "import sys; print('starting', file=sys.stderr); "
        "print('error: WEATHER_TOKEN is not set', file=sys.stderr); sys.exit(3)"
    )
    spec = McpServerSpec(
        name="weather",
        transport="stdio",
        command=sys.executable,
        args=("-c", script),
        restart_initial_s=3600,
    )
    server = McpServer(spec)
    server.pin("forecast")
    servers = McpServers([server])
    await servers.start()
    try:
        reason = server.tools()["weather__forecast"].unavailable_reason
    finally:
        await servers.stop()
    assert warnings(caplog) == [
        f"mcp server weather failed to start: {sys.executable} exited with code 3; last stderr "
        "line: 'error: WEATHER_TOKEN is not set'; its tools are unavailable, retrying in 3600s"
    ]
    assert reason == "MCP server 'weather' is not connected (its process exited with code 3)"


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == "agio_grpc.engine.mcp" and record.levelno == logging.WARNING
    ]


async def test_stop_ends_and_reaps_the_stdio_server(tmp_path: Path) -> None:
    events = tmp_path / "events.txt"
    async with connected(stdio_spec(events), events) as box:
        pid = int((await box.call("pid")).content.splitlines()[0])
        assert process_exists(pid)
    assert not process_exists(pid)  # ended and waited for: not even a zombie


def process_exists(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


async def test_tools_of_a_server_that_is_down_are_unavailable(tmp_path: Path) -> None:
    spec = McpServerSpec(
        name="broken",
        transport="stdio",
        command=sys.executable,
        args=("-c", "raise SystemExit(1)"),
        restart_initial_s=0.05,
        connect_timeout_s=5,
    )
    server = McpServer(spec)
    server.pin("hello")
    servers = McpServers([server])
    await servers.start()
    try:
        box = Toolbox(server, tmp_path / "events.txt")
        assert not server.connected
        assert not server.tools()["broken__hello"].available
        assert box.registry.definitions(["broken__hello"]) == []  # not offered to models
        result = await box.call("hello")
        assert result.is_error
        assert "is unavailable" in result.content
    finally:
        await servers.stop()


async def test_a_call_to_a_tool_that_requires_task_support_never_reaches_the_server(
    tmp_path: Path, reference_servers: ReferenceServers
) -> None:
    spec = McpServerSpec(
        name="everything",
        transport="stdio",
        command=str(shutil.which("node")),
        args=(str(reference_servers.everything), "stdio"),
        connect_timeout_s=60,
    )
    async with connected(spec, tmp_path / "events.txt") as box:
        research = box.server.tools()["everything__simulate-research-query"]
        assert (research.listed, research.requires_task, research.available) == (True, True, False)
        assert box.registry.definitions([research.name]) == []
        # A model that saw the tool elsewhere calls it anyway: refused here, not with -32601.
        result = await box.call("simulate-research-query", '{"topic": "tides"}')
        sum_result = await box.call("get-sum", '{"a": 2, "b": 40}')
    assert result.is_error
    assert result.content == (
        f"tool 'everything__simulate-research-query' is unavailable: {TASK_SUPPORT_MISSING}"
    )
    assert sum_result.content == "The sum of 2 and 40 is 42."  # the server's other tools work


async def test_allowed_and_blocked_tools_filter_the_listing(http_server: HttpToolbox) -> None:
    spec = http_spec(
        http_server.url, allowed_tools=frozenset({"hello", "add"}), blocked_tools=frozenset({"add"})
    )
    async with connected(spec, http_server.events) as box:
        assert set(box.server.tools()) == {"toolbox__hello"}


async def test_header_values_name_environment_variables(http_server: HttpToolbox) -> None:
    config = McpServerConfig(
        name="toolbox", url=http_server.url, headers={"X-Api-Key": "${TOOLBOX_KEY}"}
    )
    spec = mcp_server_spec(config, {"TOOLBOX_KEY": "s3cret"})
    async with connected(spec, http_server.events) as box:
        result = await box.call("header", '{"name": "X-Api-Key"}')
        assert result.content.splitlines()[0] == "s3cret"
