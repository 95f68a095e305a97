"""The run console in headless Chromium (Debian's package, driven by Playwright): the page a
person opens at `/` of the HTTP listener, against the real server and the fake model.

Skipped without a Chromium (`apt-get install chromium`), failed instead when
AGIO_REQUIRE_CHROMIUM=1 (CI). With AGIO_CONSOLE_SCREENSHOT=PATH the tool-call test saves its
screenshot there (the README's picture: docs/console.png).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from agio_grpc.client import AgioClient
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer, ToolCallSpec, Turn
from tests.roles import open_roles
from tests.service.auth_helpers import auth_settings, serving
from tests.service.conftest import make_settings

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
        f"sqlite+aiosqlite:///{tmp_path / 'agio.db'}",
        fake_model.base_url,
        http_address="127.0.0.1:0",
        http={"trace_url_template": "http://jaeger.example/trace/{trace_id}"},
    )
    async with serving(settings) as app:
        yield app


async def open_console(browser: Browser, app: AgioApp) -> Page:
    assert app.http is not None
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    await page.goto(f"http://{app.http.address}/")
    await expect(page.locator("h1")).to_have_text("agio-grpc")
    assert errors == []
    return page


async def send(page: Page, text: str) -> None:
    await page.fill("#input", text)
    await page.click("#chat button[type=submit]")


async def test_the_page_loads_with_the_sessions(browser: Browser, console_app: AgioApp) -> None:
    async with AgioClient(console_app.address) as client:
        result = await client.run_to_end("hello")
    page = await open_console(browser, console_app)
    session = page.locator(f"[data-session='{result.session_id}']")
    await expect(session).to_contain_text("2 steps")
    await session.click()
    await expect(page.locator("#steps .step")).to_have_count(2)
    await expect(page.locator("#runs .run .status")).to_have_text(["COMPLETED"])


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


async def test_cancel_ends_a_run_cancelled(
    browser: Browser, console_app: AgioApp, fake_model: FakeModelServer
) -> None:
    fake_model.enqueue(Turn.hanging())
    page = await open_console(browser, console_app)
    await send(page, "wait for the model")
    await expect(page.locator("#live")).to_have_attribute(
        "data-run", re.compile(r"^run_"), timeout=WAIT_MS
    )
    await page.click("#cancel")
    await expect(page.locator("#live .status")).to_have_text(
        "CANCELLED: cancelled in the console", timeout=WAIT_MS
    )
    await expect(page.locator("#runs .run .status")).to_have_text(["CANCELLED"])


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
        f"sqlite+aiosqlite:///{tmp_path / 'agio.db'}",
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
