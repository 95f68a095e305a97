"""The run console in headless Chromium (Debian's package, driven by Playwright): the page a
person opens at `/` of the HTTP listener, against the real server and the fake model.

Skipped without a Chromium (`apt-get install chromium`), failed instead when
AGIO_REQUIRE_CHROMIUM=1 (CI). With AGIO_CONSOLE_SCREENSHOT=PATH the tool-call test saves its
screenshot there (the README's picture: docs/console.png).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import AsyncIterator, Awaitable
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from agio_grpc.client import AgioClient, AgioError, collect
from agio_grpc.config import AgentConfig, McpServerConfig
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from agio_grpc.v1 import agent_service_pb2, resources_pb2
from tests.mcp.conftest import TOOLBOX
from tests.roles import open_roles
from tests.service.auth_helpers import auth_settings, serving
from tests.service.conftest import make_settings
from tests.sqlite import sqlite_at

# A browser and a server each: `make test-slow`, which CI runs (keeps `make test` short).
pytestmark = pytest.mark.slow

SESSION_PAGE = 20  # clients/ts/console/main.ts
WAIT_MS = 15_000


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("AGIO_REQUIRE_CHROMIUM") == "1":
            pytest.fail("Chromium is required (AGIO_REQUIRE_CHROMIUM=1): apt-get install chromium")
        pytest.skip("no Chromium: apt-get install chromium")
    return found


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    executable = chromium()
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=executable, args=["--no-sandbox"]
        )
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
async def console_app(tmp_path: Path, fake_model: FakeModelServer) -> AsyncIterator[AgioApp]:
    settings = make_settings(
        sqlite_at(tmp_path / "agio.db"),
        fake_model.base_url,
        http_address="127.0.0.1:0",
        http={"trace_url_template": "http://jaeger.example/trace/{trace_id}"},
    )
    async with serving(settings) as app:
        yield app


async def open_console(browser: Browser, app: AgioApp, width: int = 1280) -> Page:
    assert app.http is not None
    page = await browser.new_page(viewport={"width": width, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    await page.goto(f"http://{app.http.address}/")
    await expect(page.locator("h1")).to_have_text("agio-grpc")
    await settled(page)
    assert errors == []
    return page


async def settled(page: Page) -> None:
    """Wait until the page has done what it was last asked, reloads after it included."""
    await expect(page.locator("main")).to_have_attribute("aria-busy", "false", timeout=WAIT_MS)


async def open_session(page: Page, session_id: str) -> None:
    await page.click(f"[data-session='{session_id}']")
    await settled(page)


async def send(page: Page, text: str) -> None:
    await page.fill("#input", text)
    await page.click("#chat button[type=submit]")


async def a_session_with_a_tool_call_then_a_reply(client: AgioClient) -> str:
    """#1 user, #2 assistant calling calculate, #3 its result, #4 the answer, #5 user, #6
    the answer (the fake model's default replies)."""
    first = await client.run_to_end("What is 12 * 7?")
    await client.run_to_end("and again", session_id=first.session_id)
    return first.session_id


async def test_the_page_loads_with_the_sessions_by_their_first_message(
    browser: Browser, console_app: AgioApp
) -> None:
    async with AgioClient(console_app.address) as client:
        result = await client.run_to_end("hello")
    page = await open_console(browser, console_app)
    session = page.locator(f"[data-session='{result.session_id}']")
    await expect(session.locator(".title")).to_have_text("hello")
    await expect(session).to_contain_text("2 steps")
    await open_session(page, result.session_id)
    await expect(page.locator("#steps .step")).to_have_count(2)
    headers = page.locator("#runs-table thead th")
    await expect(headers).to_have_text(
        ["Run", "Agent", "Status", "Stop reason", "Steps", "Started"]
    )
    await expect(page.locator("#runs .run .status")).to_have_text(["COMPLETED"])
    await expect(page.locator("#runs .run .agent")).to_have_text(["assistant"])
    await expect(page.locator("#runs .run .steps")).to_have_text(["#1\N{EN DASH}#2"])


async def test_a_run_streams_text_live_and_ends_with_its_stop_reason(
    browser: Browser, console_app: AgioApp, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(replace(Turn.words("first second third"), chunk_delay=0.4))
    page = await open_console(browser, console_app)
    await send(page, "Tell me three words")
    # The first word is on the page while the run is still going.
    await page.wait_for_function(
        """() => document.querySelector('#live .content')?.textContent === 'first'
             && document.querySelector('#live .status').textContent === 'running…'""",
        timeout=WAIT_MS,
    )
    await expect(page.locator("#live .status")).to_have_text("COMPLETED", timeout=WAIT_MS)
    await expect(page.locator("#live .content")).to_have_text("first second third")
    await expect(page.locator("#steps .step.assistant .content")).to_have_text("first second third")


async def test_a_tool_call_shows_its_result(
    browser: Browser, console_app: AgioApp, fake_model: FakeModelServer, tmp_path: Path
) -> None:
    fake_model.enqueue(
        Turn.tool_calls([ToolCallSpec("calculate", '{"expression": "12 * 7"}')]),
        Turn.text("It is 84."),
    )
    page = await open_console(browser, console_app)
    await send(page, "What is 12 * 7?")
    await expect(page.locator("#live .tool-result")).to_have_text("calculate → 84")
    await expect(page.locator("#live .status")).to_have_text("COMPLETED", timeout=WAIT_MS)
    tool_step = page.locator("#steps .step.tool")
    await expect(tool_step.locator(".content")).to_have_text("84")
    await expect(page.locator("#steps .step.assistant .tool-call")).to_contain_text("calculate")
    await expect(page.locator("#steps .step.assistant .metrics").first).to_contain_text(
        "first token"
    )
    shot = Path(os.environ.get("AGIO_CONSOLE_SCREENSHOT") or tmp_path / "console.png")
    picture = await page.screenshot(path=str(shot), full_page=True)
    assert picture.startswith(b"\x89PNG")


async def test_a_tool_call_s_progress_shows_while_it_runs(
    browser: Browser, tmp_path: Path, fake_model: FakeModelServer
) -> None:
    helper = AgentConfig(name="helper", model="fake-model", instructions="Help.", tools=[])
    settings = make_settings(
        sqlite_at(tmp_path / "agio.db"),
        fake_model.base_url,
        http_address="127.0.0.1:0",
    )
    front = settings.agents[0].model_copy(update={"agents": ["helper"]})
    settings = settings.model_copy(update={"agents": [front, helper]})
    ask = ToolCallSpec("helper", '{"input": "2+2?"}')
    fake_model.enqueue(Turn.tool_calls([ask]), Turn.text("4"), Turn.text("The helper says 4."))
    async with serving(settings) as app:
        page = await open_console(browser, app)
        await send(page, "Ask the helper")
        await expect(page.locator("#live .status")).to_have_text("COMPLETED", timeout=WAIT_MS)
        progress = page.locator("#live .tool-progress")
        await expect(progress).to_have_count(1)
        await expect(progress).to_contain_text("helper … agent 'helper' is working on it")


async def test_a_trace_id_links_through_the_configured_template(
    browser: Browser, console_app: AgioApp
) -> None:
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    traced = (("traceparent", f"00-{trace_id}-00f067aa0ba902b7-01"),)
    async with AgioClient(console_app.address, metadata=traced) as client:
        result = await client.run_to_end("hello")
    page = await open_console(browser, console_app)
    await page.click(f"[data-session='{result.session_id}']")
    link = page.locator("#steps .step.assistant .metrics a")
    await expect(link).to_have_attribute("href", f"http://jaeger.example/trace/{trace_id}")


async def test_cancel_keeps_the_partial_output_on_the_timeline_marked_cancelled(
    browser: Browser, console_app: AgioApp, fake_model: FakeModelServer
) -> None:
    # The second word would come in a minute: the run is cancelled in between.
    fake_model.enqueue(Turn.words("partial answer", chunk_delay=60))
    page = await open_console(browser, console_app)
    await send(page, "tell me")
    live = page.locator("#live")
    await expect(live.locator(".content")).to_have_text("partial", timeout=WAIT_MS)
    await expect(live.locator(".sent")).to_have_text("tell me")
    await expect(live.locator(".status")).to_have_text("running…")
    await expect(live).to_have_attribute("data-run", re.compile(r"^run_"))
    await page.click("#cancel")
    await expect(live.locator(".status")).to_have_text(
        "CANCELLED: cancelled in the console", timeout=WAIT_MS
    )
    await settled(page)
    await expect(page.locator("#runs .run .status")).to_have_text(["CANCELLED"])
    timeline = page.locator("#steps > li")
    await expect(timeline).to_have_count(2)
    unfinished = timeline.nth(1)
    await expect(unfinished).to_have_class(re.compile(r"\bunfinished\b"))
    await expect(unfinished.locator(".content")).to_have_text("partial")
    await expect(unfinished.locator(".mark")).to_have_text("cancelled")
    await expect(live.locator(".content")).to_have_count(0)  # moved, not shown twice
    # It stays where it happened, after the question it answered, as the session goes on.
    await send(page, "next one")
    await expect(live.locator(".status")).to_have_text("COMPLETED", timeout=WAIT_MS)
    await settled(page)
    await expect(timeline).to_have_count(4)
    await expect(timeline.nth(1).locator(".content")).to_have_text("partial")
    await expect(timeline.nth(2)).to_have_attribute("data-sequence", "2")


async def test_an_error_of_a_streamed_call_stays_until_the_next_action(
    browser: Browser, console_app: AgioApp, fake_model: FakeModelServer
) -> None:
    async with AgioClient(console_app.address) as client:
        first = await client.run_to_end("hello")
        fake_model.enqueue(Turn.hanging())
        busy = await client.start_run("wait for the model", session_id=first.session_id)
        page = await open_console(browser, console_app)
        await open_session(page, first.session_id)
        # Another client's run has the session: no retry is offered, and says why.
        retry = page.locator("#steps .step[data-sequence='2'] .retry")
        await expect(retry).to_be_disabled()
        await expect(retry).to_have_attribute("title", re.compile(f"Run {busy.id} has"))
        await send(page, "hello")
        error = page.locator("#error")
        await expect(error).to_contain_text("FAILED_PRECONDITION SESSION_BUSY", timeout=WAIT_MS)
        # The reloads after the failed call are done, and the reason is still there.
        await settled(page)
        await expect(page.locator("#steps .step")).to_have_count(3)
        await expect(error).to_contain_text("FAILED_PRECONDITION SESSION_BUSY")
        await expect(page.locator("#live .status")).to_have_text("failed")
        await client.cancel_run(busy.id)
        await open_session(page, first.session_id)  # the next action
        await expect(error).to_have_text("")
        await expect(retry).to_be_enabled()


async def test_the_offered_retries_and_forks_are_exactly_those_the_server_accepts(
    browser: Browser, console_app: AgioApp
) -> None:
    async with AgioClient(console_app.address) as client:
        session_id = await a_session_with_a_tool_call_then_a_reply(client)
        page = await open_console(browser, console_app)
        await open_session(page, session_id)
        steps = page.locator("#steps .step")
        await expect(steps).to_have_count(6)
        offered = {
            action: [await steps.nth(i).locator(f".{action}").is_enabled() for i in range(6)]
            for action in ("retry", "fork")
        }
        accepted: dict[str, list[bool]] = {"retry": [], "fork": []}
        for sequence in range(1, 7):
            accepted["fork"].append(await answers(client.fork_session(session_id, sequence)))
            copy = await client.fork_session(session_id)  # a retry deletes: try it on a copy
            accepted["retry"].append(await answers(collect(client.retry(copy.id, sequence))))
    assert offered == accepted
    # Retry: not from #1 (nothing before it), nor from #5 (after a final reply).
    assert accepted["retry"] == [False, True, True, True, False, True]
    # Fork: not at #2, whose tool call has no result yet at that point.
    assert accepted["fork"] == [True, False, True, True, True, True]
    await expect(steps.nth(0).locator(".retry")).to_have_attribute(
        "title", re.compile("at least one step")
    )
    await expect(steps.nth(4).locator(".retry")).to_have_attribute(
        "title", re.compile(r"#4 before it is a final assistant reply")
    )
    await expect(steps.nth(1).locator(".fork")).to_have_attribute(
        "title", re.compile(r"tool calls of step #2 without results")
    )


async def answers(call: Awaitable[object]) -> bool:
    """Whether the server accepts the call (a refusal is INVALID_ARGUMENT)."""
    try:
        await call
    except AgioError as error:
        refused = error
    else:
        return True
    assert refused.code == grpc.StatusCode.INVALID_ARGUMENT, refused
    return False


async def test_a_retry_says_what_it_deletes_and_waits_for_a_yes(
    browser: Browser, console_app: AgioApp
) -> None:
    async with AgioClient(console_app.address) as client:
        # #1 the question, #2 the calculate call, #3 its result: out of steps before an answer.
        one_step = agent_service_pb2.RunOverrides(max_steps=1)
        first = await client.run_to_end("What is 12 * 7?", overrides=one_step)
        await client.run_to_end("and then?", session_id=first.session_id)
        page = await open_console(browser, console_app)
        await open_session(page, first.session_id)
        question = page.locator("#steps .step[data-sequence='4']")
        await question.locator(".retry").click()
        confirm = question.locator(".confirm")
        await expect(confirm).to_contain_text(
            "Deletes steps #4\N{EN DASH}#5 (the user message #4 among them), then the model "
            "continues its answer to #1 from #3."
        )
        await confirm.locator(".confirm-keep").click()
        await expect(confirm).to_have_count(0)
        assert len(await client.list_steps(first.session_id)) == 5
        await question.locator(".retry").click()
        await confirm.locator(".confirm-retry").click()
        await expect(page.locator("#live .status")).to_have_text("COMPLETED", timeout=WAIT_MS)
        await settled(page)
        await expect(page.locator("#steps .step")).to_have_count(4)
        await expect(page.locator("#steps .step.user .content")).to_have_text(["What is 12 * 7?"])
        answer = page.locator("#steps .step[data-sequence='4'] .content")
        await expect(answer).to_have_text("The result is 84.")


async def test_the_agent_picker_runs_the_picked_agent_mcp_only_included(
    browser: Browser, tmp_path: Path, fake_model: FakeModelServer
) -> None:
    toolbox = McpServerConfig(name="toolbox", command=sys.executable, args=[str(TOOLBOX)])
    researcher = AgentConfig(
        name="researcher", model="fake-model", instructions="Research.", tools=[], mcp=["toolbox"]
    )
    settings = make_settings(
        sqlite_at(tmp_path / "agio.db"),
        fake_model.base_url,
        http_address="127.0.0.1:0",
        mcp_servers=[toolbox],
    )
    settings = settings.model_copy(update={"agents": [*settings.agents, researcher]})
    async with serving(settings) as app:
        page = await open_console(browser, app)
        picker = page.locator("#agent")
        await expect(picker.locator("option")).to_have_text(["assistant", "researcher"])
        await expect(picker).to_have_value("assistant")  # the default agent first
        await picker.select_option("researcher")
        await send(page, "Please use the toolbox__hello tool.")
        await expect(page.locator("#live .tool-result")).to_contain_text(
            "toolbox__hello → hello from the toolbox", timeout=WAIT_MS
        )
        await expect(page.locator("#live .status")).to_have_text("COMPLETED", timeout=WAIT_MS)
        await settled(page)
        await expect(page.locator("#runs .run .agent")).to_have_text(["researcher"])
        await expect(picker).to_have_value("researcher")  # the session's agent
        await page.click("#new-session")
        await expect(picker).to_have_value("assistant")
    offered = {tool["function"]["name"] for tool in fake_model.requests[0]["tools"]}
    assert "toolbox__hello" in offered
    assert "calculate" not in offered


async def test_the_page_fits_a_360_pixel_wide_screen_and_every_width_up(
    browser: Browser, console_app: AgioApp, tmp_path: Path
) -> None:
    async with AgioClient(console_app.address) as client:
        session_id = await a_session_with_a_tool_call_then_a_reply(client)
    page = await open_console(browser, console_app, width=360)
    await open_session(page, session_id)
    await expect(page.locator("#steps .step")).to_have_count(6)
    picture = await page.screenshot(path=str(tmp_path / "narrow.png"), full_page=True)
    assert picture.startswith(b"\x89PNG")
    # A phone, a small tablet, a narrow window: nothing sticks out, nothing scrolls sideways.
    for width in (360, 480, 600, 720, 840, 1024):
        await page.set_viewport_size({"width": width, "height": 900})
        assert await page.evaluate("document.documentElement.scrollWidth") <= width, width
        for part in ("header", "nav", "#session-title", "#steps", "#chat", "#runs-table"):
            box = await page.locator(part).bounding_box()
            assert box is not None, part
            assert box["x"] >= 0, (width, part, box)
            assert box["x"] + box["width"] <= width, (width, part, box)


async def test_a_fork_opens_the_new_session(browser: Browser, console_app: AgioApp) -> None:
    async with AgioClient(console_app.address) as client:
        first = await client.run_to_end("hello")
        await client.run_to_end("and again", session_id=first.session_id)
    page = await open_console(browser, console_app)
    await page.click(f"[data-session='{first.session_id}']")
    await expect(page.locator("#steps .step")).to_have_count(4)
    await page.locator("#steps .step[data-sequence='2'] .fork").click()
    title = page.locator("#session-title")
    await expect(title).not_to_have_text(first.session_id, timeout=WAIT_MS)
    await expect(title).to_have_text(re.compile(r"^sess_"))
    await expect(page.locator("#steps .step")).to_have_count(2)


async def test_a_retry_from_a_step_streams_a_new_run(
    browser: Browser, console_app: AgioApp, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.text("first answer"), Turn.text("second answer"))
    async with AgioClient(console_app.address) as client:
        first = await client.run_to_end("hello")
    page = await open_console(browser, console_app)
    await page.click(f"[data-session='{first.session_id}']")
    await expect(page.locator("#steps .step.assistant .content")).to_have_text("first answer")
    await page.locator("#steps .step[data-sequence='2'] .retry").click()
    await expect(page.locator(".confirm")).to_contain_text(
        "Deletes step #2, then the model answers #1 again."
    )
    await page.click(".confirm .confirm-retry")
    await expect(page.locator("#live .status")).to_have_text("COMPLETED", timeout=WAIT_MS)
    await expect(page.locator("#steps .step.assistant .content")).to_have_text("second answer")
    await expect(page.locator("#runs .run")).to_have_count(2)


async def test_the_sessions_list_pages(browser: Browser, console_app: AgioApp) -> None:
    async with AgioClient(console_app.address) as client:
        for index in range(SESSION_PAGE + 1):
            await client.run_to_end(f"session {index}")
    page = await open_console(browser, console_app)
    sessions = page.locator("#sessions .session")
    await expect(sessions).to_have_count(SESSION_PAGE)
    await page.click("#more-sessions")
    await expect(sessions).to_have_count(SESSION_PAGE + 1)
    await expect(page.locator("#more-sessions")).to_be_hidden()


async def test_a_credential_entered_in_the_page_is_used(
    browser: Browser, tmp_path: Path, fake_model: FakeModelServer
) -> None:
    settings = auth_settings(
        sqlite_at(tmp_path / "agio.db"),
        fake_model.base_url,
        http_address="127.0.0.1:0",
        auth={"mode": "api_key", "api_key": {"cache_s": 0}},
    )
    async with serving(settings) as app:
        store = await open_roles(settings.database_url)
        try:
            issued = await store.keys().create("acme")
        finally:
            await store.close()
        page = await open_console(browser, app)
        await expect(page.locator("#error")).to_contain_text("UNAUTHENTICATED CREDENTIALS_MISSING")
        await page.fill("#token", issued.token)
        await page.click("#token-form button")
        await expect(page.locator("#error")).to_have_text("")
        await send(page, "hello")
        await expect(page.locator("#live .status")).to_have_text("COMPLETED", timeout=WAIT_MS)


async def test_a_runs_structured_output_shows_as_formatted_json(
    browser: Browser, console_app: AgioApp, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.json({"city": "Paris", "population": 2100000}))
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
        "required": ["city", "population"],
    }
    async with AgioClient(console_app.address) as client:
        result = await client.run_to_end("Which city?", output_schema=schema)
    page = await open_console(browser, console_app)
    await open_session(page, result.session_id)
    output = page.locator("#runs .run-output pre.output")
    await expect(output).to_have_count(1)
    assert json.loads(await output.inner_text()) == {"city": "Paris", "population": 2100000}
    await expect(output).to_contain_text('\n  "city": "Paris"')


async def a_run_waiting_for_approval(client: AgioClient, fake_model: FakeModelServer) -> str:
    """A session whose run waits for decisions on two `calculate` calls; its id."""
    fake_model.enqueue(
        Turn.tool_calls(
            [
                ToolCallSpec("calculate", '{"expression": "12 * 7"}', id="call_yes"),
                ToolCallSpec("calculate", '{"expression": "1 / 0"}', id="call_no"),
            ]
        )
    )
    waiting = await client.run_to_end("Two sums", require_approval=["calculate"])
    assert waiting.run.status == resources_pb2.RUN_STATUS_REQUIRES_ACTION
    return waiting.session_id


async def test_approve_and_reject_the_calls_a_run_waits_for_then_it_goes_on(
    browser: Browser, console_app: AgioApp, fake_model: FakeModelServer
) -> None:
    async with AgioClient(console_app.address) as client:
        session_id = await a_run_waiting_for_approval(client, fake_model)
    page = await open_console(browser, console_app)
    await open_session(page, session_id)
    panel = page.locator("#steps .approvals")
    await expect(panel.locator(".pending")).to_have_count(2)
    await expect(panel.locator(".pending .tool")).to_have_text(["calculate", "calculate"])
    await expect(panel.locator("[data-call='call_yes'] code")).to_have_text(
        '{"expression": "12 * 7"}'
    )

    fake_model.enqueue(Turn.text("84, and the other one was refused."))
    await panel.locator("[data-call='call_yes'] .approve").click()
    await expect(panel.locator("[data-call='call_yes'] .choice")).to_have_text("approved")
    # One decision of two: nothing is submitted yet (a submit puts what it sent in #live at
    # once, in the click's own handler).
    assert await page.locator("#live .sent").count() == 0
    await panel.locator("[data-call='call_no'] .reason").fill("no dividing by zero")
    await panel.locator("[data-call='call_no'] .reject").click()

    await expect(page.locator("#live .status")).to_have_text("COMPLETED", timeout=WAIT_MS)
    await settled(page)
    await expect(page.locator("#steps .approvals")).to_have_count(0)
    tools = page.locator("#steps .step.tool")
    await expect(tools.locator(".decision")).to_have_count(2)
    await expect(tools.filter(has_text="84").locator(".decision")).to_contain_text("approved by")
    rejected = tools.filter(has_text="was rejected")
    await expect(rejected.locator(".decision")).to_contain_text("rejected by")
    await expect(rejected.locator(".decision")).to_contain_text("no dividing by zero")
    seen = {
        m["tool_call_id"]: m["content"]
        for m in fake_model.requests[-1]["messages"]
        if m["role"] == "tool"
    }
    assert seen["call_yes"] == "84"
    assert "no dividing by zero" in seen["call_no"]


async def test_a_wait_that_also_needs_client_outputs_is_shown_but_left_to_its_client(
    browser: Browser, console_app: AgioApp, fake_model: FakeModelServer
) -> None:
    lookup = {"name": "lookup", "description": "Look it up.", "parameters_json": "{}"}
    fake_model.enqueue(
        Turn.tool_calls(
            [
                ToolCallSpec("calculate", '{"expression": "2 + 2"}', id="call_calc"),
                ToolCallSpec("lookup", "{}", id="call_client"),
            ]
        )
    )
    async with AgioClient(console_app.address) as client:
        waiting = await client.run_to_end(
            "Both", require_approval=["calculate"], client_tools=[lookup]
        )
    page = await open_console(browser, console_app)
    await open_session(page, waiting.session_id)
    panel = page.locator("#steps .approvals")
    await expect(panel.locator(".note")).to_contain_text("client tool outputs")
    await expect(panel.locator(".approve")).to_be_disabled()
    await expect(panel.locator(".reject")).to_be_disabled()
