"""MCP tools through the real service: the gRPC server, the fake model over HTTP, SQLite,
and the toolbox MCP server (Streamable HTTP, one process per module; stdio where the test
says so), or the MCP project's reference server-everything (pinned, installed with npm by
tests/mcp/reference.py). Configuration mistakes stop the start with one line naming the
setting."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from pydantic import ValidationError

from agio_grpc.client import AgioClient, AgioError
from agio_grpc.config import AgentConfig, McpServerConfig, Settings
from agio_grpc.engine.mcp import TASK_SUPPORT_MISSING
from agio_grpc.service.app import AgioApp
from agio_grpc.service.mcp_setup import mcp_server_spec
from agio_grpc.service.startup import StartupError
from agio_grpc.testing import FakeModelServer
from agio_grpc.v1 import agent_service_pb2, resources_pb2
from tests.mcp.conftest import TOOLBOX, HttpToolbox, eventually, http_toolbox, wait_for
from tests.mcp.reference import ReferenceServers
from tests.service.auth_helpers import serving
from tests.service.conftest import make_settings
from tests.sqlite import sqlite_at


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpToolbox]:
    with http_toolbox(tmp_path_factory.mktemp("http") / "events.txt") as served:
        yield served


def toolbox_http(url: str, **fields: Any) -> McpServerConfig:
    return McpServerConfig(name="toolbox", url=url, **fields)


def toolbox_stdio(*options: str, **fields: Any) -> McpServerConfig:
    return McpServerConfig(
        name="toolbox", command=sys.executable, args=[str(TOOLBOX), *options], **fields
    )


def mcp_settings(
    tmp_path: Path, model: FakeModelServer, servers: list[McpServerConfig], **agent: Any
) -> Settings:
    return make_settings(
        sqlite_at(tmp_path / "agio.db"),
        model.base_url,
        mcp_servers=servers,
        agents=[AgentConfig(name="assistant", **({"tools": ["echo"]} | agent))],
    )


@pytest.fixture
async def fake_model() -> AsyncIterator[FakeModelServer]:
    async with FakeModelServer() as server:
        yield server


async def run_to_end(client: AgioClient, text: str, **options: Any) -> list[Any]:
    return [event async for event in client.run(text, **options)]


async def listed_tools(client: AgioClient) -> dict[str, resources_pb2.ToolDefinition]:
    """The one agent's tools as ListAgents gives them, by name."""
    (agent,) = await client.list_agents()
    return {tool.name: tool for tool in agent.tools}


def offered_to_model(request: dict[str, Any]) -> list[str]:
    return [tool["function"]["name"] for tool in request.get("tools", [])]


async def steps_of(client: AgioClient, events: list[Any]) -> list[resources_pb2.Step]:
    return list(await client.list_steps(events[-1].run_completed.run.session_id))


async def test_a_run_calls_an_mcp_tool_as_an_ordinary_tool_step(
    tmp_path: Path, fake_model: FakeModelServer, http_server: HttpToolbox
) -> None:
    settings = mcp_settings(tmp_path, fake_model, [toolbox_http(http_server.url)], mcp=["toolbox"])
    async with serving(settings) as app, AgioClient(app.address) as client:
        events = await run_to_end(client, "Please use the toolbox__hello tool.")
        run = events[-1].run_completed.run
        assert run.stop_signal.reason == resources_pb2.STOP_REASON_COMPLETED
        steps = await client.list_steps(run.session_id)
    tool_steps = [step for step in steps if step.role == resources_pb2.ROLE_TOOL]
    assert [(step.name, step.is_error) for step in tool_steps] == [("toolbox__hello", False)]
    assert tool_steps[0].content.startswith("hello from the toolbox")
    offered = {tool["function"]["name"] for tool in fake_model.requests[0]["tools"]}
    assert {"echo", "toolbox__hello", "toolbox__add"} <= offered


async def test_list_agents_shows_mcp_tools_with_schemas_and_availability_while_serving(
    tmp_path: Path, fake_model: FakeModelServer, http_server: HttpToolbox
) -> None:
    down = McpServerConfig(
        name="down",
        command=sys.executable,
        args=["-c", "raise SystemExit(1)"],
        connect_timeout_s=5,
    )
    settings = mcp_settings(
        tmp_path,
        fake_model,
        [toolbox_http(http_server.url, blocked_tools=["crash"]), down],
        tools=["echo", "toolbox.add", "down.hello"],
        mcp=["toolbox"],
    )
    async with serving(settings) as app, AgioClient(app.address) as client:
        (agent,) = await client.list_agents()
        assert await client.health() == "SERVING"  # with a server down
    tools = {tool.name: tool for tool in agent.tools}
    assert list(tools)[:3] == ["echo", "toolbox__add", "down__hello"]
    assert "toolbox__crash" not in tools  # blocked
    assert "toolbox__slow" in tools  # by `mcp: [toolbox]`
    add = tools["toolbox__add"]
    assert (add.source, add.unavailable) == ("mcp:toolbox", False)
    assert json.loads(add.parameters_json)["required"] == ["a", "b"]
    assert (tools["echo"].source, tools["echo"].unavailable) == ("python", False)
    hello = tools["down__hello"]
    assert (hello.source, hello.unavailable) == ("mcp:down", True)
    assert hello.unavailable_reason == (
        "MCP server 'down' is not connected (its process exited with code 1)"
    )
    assert (add.unavailable_reason, tools["echo"].unavailable_reason) == ("", "")


async def test_a_killed_stdio_server_is_gone_from_list_agents_and_the_next_run_at_once(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    # It cannot start a second time, so its tools stay away; and no ping comes for an hour.
    once = tmp_path / "started"
    toolbox = toolbox_stdio("--start-once", str(once), ping_interval_s=3600)
    settings = mcp_settings(tmp_path, fake_model, [toolbox], mcp=["toolbox"])
    async with serving(settings) as app, AgioClient(app.address) as client:
        assert not (await listed_tools(client))["toolbox__hello"].unavailable
        first = await steps_of(client, await run_to_end(client, "use the toolbox__pid tool"))
        (pid_step,) = [step for step in first if step.role == resources_pb2.ROLE_TOOL]
        os.kill(int(pid_step.content.splitlines()[0]), signal.SIGKILL)

        async def hello_when_gone() -> resources_pb2.ToolDefinition | None:
            hello = (await listed_tools(client))["toolbox__hello"]
            return hello if hello.unavailable else None

        hello = await eventually(hello_when_gone, "ListAgents to mark the tools unavailable")
        asked = len(fake_model.requests)
        second = await steps_of(client, await run_to_end(client, "use the toolbox__hello tool"))
    assert hello.unavailable_reason.startswith("MCP server 'toolbox' is not connected (")
    assert offered_to_model(fake_model.requests[asked]) == ["echo"]
    assert [step.role for step in second] == [
        resources_pb2.ROLE_USER,
        resources_pb2.ROLE_ASSISTANT,
    ]  # the model had no toolbox__hello to call


async def test_a_tool_that_requires_task_support_is_not_offered_and_list_agents_says_why(
    tmp_path: Path, fake_model: FakeModelServer, reference_servers: ReferenceServers
) -> None:
    everything = McpServerConfig(
        name="everything",
        command="node",
        args=[str(reference_servers.everything), "stdio"],
        connect_timeout_s=60,
    )
    settings = mcp_settings(tmp_path, fake_model, [everything], mcp=["everything"])
    async with serving(settings) as app, AgioClient(app.address) as client:
        tools = await listed_tools(client)
        events = await run_to_end(client, "use the everything__simulate-research-query tool")
        steps = await steps_of(client, events)
    research = tools["everything__simulate-research-query"]
    assert (research.unavailable, research.unavailable_reason) == (True, TASK_SUPPORT_MISSING)
    echo = tools["everything__echo"]
    assert (echo.unavailable, echo.unavailable_reason) == (False, "")
    offered = offered_to_model(fake_model.requests[0])
    assert "everything__echo" in offered
    assert "everything__simulate-research-query" not in offered
    assert events[-1].run_completed.run.stop_signal.reason == resources_pb2.STOP_REASON_COMPLETED
    # Never called, so never refused with -32601: the model answered without it.
    assert [step.role for step in steps] == [resources_pb2.ROLE_USER, resources_pb2.ROLE_ASSISTANT]


async def test_npx_as_a_command_starts_with_the_default_environment_and_no_env_entry(
    tmp_path: Path,
    fake_model: FakeModelServer,
    reference_servers: ReferenceServers,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("AGIO_TEST_SERVICE_SECRET", "for the service only")
    npx = McpServerConfig(
        name="everything",
        command="npx",  # without PATH it finds no `mcp-server-everything` to run
        args=["--offline", "--prefix", str(reference_servers.prefix), "mcp-server-everything"],
        connect_timeout_s=60,
    )
    settings = mcp_settings(tmp_path, fake_model, [npx], tools=["everything.get-env"])
    async with serving(settings) as app, AgioClient(app.address) as client:
        tools = await listed_tools(client)
        steps = await steps_of(client, await run_to_end(client, "use the everything__get-env tool"))
    assert not tools["everything__get-env"].unavailable
    (tool_step,) = [step for step in steps if step.role == resources_pb2.ROLE_TOOL]
    assert not tool_step.is_error
    environment = json.loads(tool_step.content)
    assert (environment["HOME"], environment["LANG"]) == (os.environ["HOME"], "C.UTF-8")
    assert "AGIO_TEST_SERVICE_SECRET" not in environment


def test_a_stdio_server_gets_path_home_and_lang_of_the_service_and_its_env_entries() -> None:
    service = {"PATH": "/usr/bin", "HOME": "/home/agio", "LANG": "C.UTF-8", "API_KEY": "k"}
    config = McpServerConfig(
        name="files", command=sys.executable, env={"LANG": "de_DE.UTF-8", "KEY": "${API_KEY}"}
    )
    assert mcp_server_spec(config, service).env == {
        "PATH": "/usr/bin",
        "HOME": "/home/agio",
        "LANG": "de_DE.UTF-8",
        "KEY": "k",
    }
    bare = McpServerConfig(name="files", command=sys.executable)
    assert mcp_server_spec(bare, {"PATH": "/bin", "API_KEY": "k"}).env == {"PATH": "/bin"}


async def test_per_run_tool_selection_covers_mcp_tools(
    tmp_path: Path, fake_model: FakeModelServer, http_server: HttpToolbox
) -> None:
    settings = mcp_settings(tmp_path, fake_model, [toolbox_http(http_server.url)], mcp=["toolbox"])
    only_add = agent_service_pb2.RunOverrides(
        tools=agent_service_pb2.ToolSelection(names=["toolbox__add"])
    )
    stranger = agent_service_pb2.RunOverrides(
        tools=agent_service_pb2.ToolSelection(names=["toolbox__nope"])
    )
    async with serving(settings) as app, AgioClient(app.address) as client:
        await run_to_end(client, "hello", overrides=only_add)
        with pytest.raises(AgioError) as refused:
            await run_to_end(client, "hello", overrides=stranger)
    assert [tool["function"]["name"] for tool in fake_model.requests[0]["tools"]] == [
        "toolbox__add"
    ]
    assert refused.value.code is grpc.StatusCode.INVALID_ARGUMENT
    assert "toolbox__nope" in refused.value.message


async def test_on_error_stop_applies_to_an_mcp_tool(
    tmp_path: Path, fake_model: FakeModelServer, http_server: HttpToolbox
) -> None:
    settings = mcp_settings(
        tmp_path,
        fake_model,
        [toolbox_http(http_server.url)],
        tools=["toolbox.fail"],
        tool_options={"toolbox.fail": {"on_error": "stop"}},
    )
    async with serving(settings) as app, AgioClient(app.address) as client:
        events = await run_to_end(client, "use the toolbox__fail tool")  # without its reason
    run = events[-1].run_failed.run
    assert run.stop_signal.reason == resources_pb2.STOP_REASON_TOOL_ERROR
    assert run.stop_signal.source == "tool:toolbox__fail"


async def test_cancel_run_mid_call_cancels_the_call_on_the_server(
    tmp_path: Path, fake_model: FakeModelServer, http_server: HttpToolbox
) -> None:
    settings = mcp_settings(tmp_path, fake_model, [toolbox_http(http_server.url)], mcp=["toolbox"])

    def seen(line: str) -> bool:
        return http_server.events.exists() and line in http_server.events.read_text()

    async with serving(settings) as app, AgioClient(app.address) as client:
        stream = client.run("use the toolbox__slow tool")  # its marker: "run"
        run_id = (await anext(stream)).run_id
        await wait_for(lambda: seen("started run"), "the call to reach the server")
        await client.cancel_run(run_id)
        events = [event async for event in stream]
        await wait_for(lambda: seen("cancelled run"), "the cancellation to reach the server")
    assert events[-1].run_completed.run.stop_signal.reason == resources_pb2.STOP_REASON_CANCELLED


@pytest.mark.parametrize(
    ("servers", "agent", "message"),
    [
        (
            [toolbox_stdio(), toolbox_stdio()],
            {},
            "mcp_servers: duplicate names toolbox",
        ),
        ([toolbox_stdio()], {"mcp": ["weather"]}, "names unknown mcp servers weather"),
        ([toolbox_stdio()], {"tools": ["weather.now"]}, "names unknown mcp servers weather"),
    ],
)
def test_config_naming_servers_wrongly_is_invalid(
    servers: list[McpServerConfig], agent: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        make_settings(
            "sqlite+aiosqlite:///unused.db",
            "http://127.0.0.1:9/v1",
            mcp_servers=servers,
            agents=[AgentConfig(name="assistant", **agent)],
        )


def test_a_server_has_exactly_one_transport() -> None:
    with pytest.raises(ValidationError, match="set exactly one of command and url"):
        McpServerConfig(name="both", command="x", url="http://127.0.0.1:1/mcp")
    with pytest.raises(ValidationError, match="set exactly one of command and url"):
        McpServerConfig(name="neither")


async def start_fails(
    tmp_path: Path, servers: list[McpServerConfig], tool_modules: tuple[str, ...] = (), **agent: Any
) -> str:
    settings = make_settings(
        sqlite_at(tmp_path / "agio.db"),
        "http://127.0.0.1:9/v1",
        mcp_servers=servers,
        tool_modules=list(tool_modules),
        agents=[AgentConfig(name="assistant", **agent)],
    )
    with pytest.raises(StartupError) as failed:
        await AgioApp.start(settings)
    return str(failed.value)


async def test_an_agent_naming_a_blocked_tool_cannot_start(tmp_path: Path) -> None:
    line = await start_fails(
        tmp_path, [toolbox_stdio(blocked_tools=["crash"])], tools=["toolbox.crash"]
    )
    assert "names tool 'toolbox.crash', which mcp server 'toolbox' blocks" in line
    assert "[agents[assistant].tools in AGIO_CONFIG]" in line


async def test_an_mcp_tool_named_like_an_in_process_tool_cannot_start(tmp_path: Path) -> None:
    line = await start_fails(
        tmp_path,
        [toolbox_stdio()],
        tool_modules=("tests.mcp.clashing_tools",),
        tools=["toolbox.hello"],
    )
    assert "MCP tool 'toolbox.hello' would be called 'toolbox__hello'" in line


async def test_a_missing_header_variable_is_named_without_any_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AGIO_TEST_MISSING_KEY", raising=False)
    line = await start_fails(
        tmp_path,
        [toolbox_http("http://127.0.0.1:9/mcp", headers={"X-Key": "${AGIO_TEST_MISSING_KEY}"})],
        mcp=["toolbox"],
    )
    assert line.startswith("environment variable AGIO_TEST_MISSING_KEY is not set")
    assert "header X-Key" in line


async def test_a_command_not_found_cannot_start(tmp_path: Path) -> None:
    server = McpServerConfig(name="toolbox", command="agio-no-such-mcp-server")
    line = await start_fails(tmp_path, [server], mcp=["toolbox"])
    assert "'agio-no-such-mcp-server' is not an executable file or on PATH" in line


def test_the_cli_marks_unavailable_tools(capsys: pytest.CaptureFixture[str]) -> None:
    from agio_grpc.cli.render import HumanPrinter

    agent = resources_pb2.Agent(
        name="assistant",
        model="fake-model",
        tools=[
            resources_pb2.ToolDefinition(name="echo", source="python"),
            resources_pb2.ToolDefinition(
                name="down__hello",
                unavailable=True,
                source="mcp:down",
                unavailable_reason="MCP server 'down' is not connected (starting)",
            ),
        ],
    )
    HumanPrinter().agents([agent], verbose=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "assistant  model=fake-model  tools: echo, down__hello (unavailable)"
    assert lines[2].startswith(
        "    down__hello (unavailable: MCP server 'down' is not connected (starting)) [mcp:down]: "
    )
