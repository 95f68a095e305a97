"""The HTTP listener answers only for its own host names (and `http.allowed_hosts`): a page
whose name was made to resolve to the server (DNS rebinding) sends its own name as Host, and
as Origin, and must be refused before any handler, on a loopback listener as on one on every
interface with `AGIO_AUTH=none`.

Requests go to 127.0.0.1 only; the Host header says which name the client dialled.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from agio_grpc.client import AgioClient
from agio_grpc.config import HttpConfig, Settings
from agio_grpc.service.app import AgioApp
from agio_grpc.service.http_listener import host_name, own_host_names
from agio_grpc.testing import FakeModelServer
from tests.service.auth_helpers import serving
from tests.service.conftest import make_settings
from tests.service.connect_wire import CONNECT_JSON, wire_error
from tests.sqlite import sqlite_at

LIST_AGENTS = "/agio.v1.AgentService/ListAgents"
REBINDING_PAGE = "attacker.example"


def settings_for(tmp_path: Path, model_url: str, http_address: str, **overrides: Any) -> Settings:
    return make_settings(
        sqlite_at(tmp_path / "agio.db"),
        model_url,
        http_address=http_address,
        **overrides,
    )


async def list_agents(app: AgioApp, host: str, origin: str | None = None) -> httpx2.Response:
    """ListAgents over Connect on 127.0.0.1, as a client that dialled `host` (`name:port`)."""
    assert app.http is not None
    headers = CONNECT_JSON | {"host": host} | ({"origin": origin} if origin else {})
    async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{app.http.port}") as http:
        return await http.post(LIST_AGENTS, content=b"{}", headers=headers)


def refused_for_host(response: httpx2.Response, host: str) -> None:
    assert response.status_code == 403, response.text
    error = wire_error(response.json())
    assert error.code == "permission_denied"
    assert error.error_info is not None
    assert error.error_info.reason == "HOST_NOT_ALLOWED"
    assert error.error_info.domain == "agio-grpc"
    assert dict(error.error_info.metadata) == {"host": host}
    assert "http.allowed_hosts" in error.message


@pytest.fixture
async def every_interface(tmp_path: Path, fake_model: FakeModelServer) -> AsyncIterator[AgioApp]:
    """Both listeners on every interface, unauthenticated (AGIO_AUTH=none), the HTTP one
    answering `agio.example.com` and the names under `example.net` besides its own."""
    settings = settings_for(
        tmp_path,
        fake_model.base_url,
        "0.0.0.0:0",
        listen_address="0.0.0.0:0",
        auth={"mode": "none"},
        http={"allowed_hosts": ["agio.example.com", "*.example.net"]},
    )
    async with serving(settings) as app:
        yield app


async def test_a_rebinding_page_is_refused_on_a_listener_on_every_interface(
    every_interface: AgioApp, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    assert every_interface.http is not None
    host = f"{REBINDING_PAGE}:{every_interface.http.port}"
    # Its Origin equals its Host: the cross-origin check alone took it for the same origin.
    response = await list_agents(every_interface, host, origin=f"http://{host}")
    refused_for_host(response, REBINDING_PAGE)
    # Not a browser: refused all the same.
    refused_for_host(await list_agents(every_interface, host), REBINDING_PAGE)
    assert f"refused a request for host '{REBINDING_PAGE}'" in caplog.text
    assert "Traceback" not in caplog.text


@pytest.mark.parametrize(
    "name",
    [
        "127.0.0.1",
        "localhost",
        "LOCALHOST.",
        "[::1]",
        "10.1.2.3",
        "agio.example.com",
        "deep.api.example.net",
    ],
    ids=["ipv4", "localhost", "localhost-fqdn", "ipv6", "any-address", "allowed", "under-domain"],
)
async def test_clients_dialling_an_address_or_a_name_it_answers_to_are_served(
    every_interface: AgioApp, name: str
) -> None:
    assert every_interface.http is not None
    response = await list_agents(every_interface, f"{name}:{every_interface.http.port}")
    assert response.status_code == 200, response.text
    assert [agent["name"] for agent in response.json()["agents"]] == ["assistant"]


async def test_the_machine_name_is_answered_on_every_interface(every_interface: AgioApp) -> None:
    assert every_interface.http is not None
    host = f"{socket.gethostname()}:{every_interface.http.port}"
    assert (await list_agents(every_interface, host)).status_code == 200


@pytest.mark.parametrize(
    "name", ["example.net", "example.net.attacker.example", "agio.example.com.evil"]
)
async def test_names_near_an_allowed_one_are_refused(every_interface: AgioApp, name: str) -> None:
    assert every_interface.http is not None
    response = await list_agents(every_interface, f"{name}:{every_interface.http.port}")
    refused_for_host(response, name)


async def test_a_loopback_listener_answers_its_loopback_names_only(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    async with serving(settings_for(tmp_path, fake_model.base_url, "127.0.0.1:0")) as app:
        assert app.http is not None
        port = app.http.port
        for served in (f"127.0.0.1:{port}", f"localhost:{port}"):
            assert (await list_agents(app, served)).status_code == 200
        page = f"http://{REBINDING_PAGE}:{port}"
        refused_for_host(
            await list_agents(app, f"{REBINDING_PAGE}:{port}", origin=page), REBINDING_PAGE
        )
        # The console is refused too: the host is checked before any page or handler.
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            console = await http.get("/", headers={"host": f"{REBINDING_PAGE}:{port}"})
        assert console.status_code == 403
        # gRPC clients dial by address or name as before.
        async with AgioClient(f"localhost:{app.port}") as client:
            assert [agent.name for agent in await client.list_agents()] == ["assistant"]


async def test_allowed_hosts_star_answers_any_name(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    settings = settings_for(
        tmp_path, fake_model.base_url, "127.0.0.1:0", http={"allowed_hosts": ["*"]}
    )
    async with serving(settings) as app:
        assert app.http is not None
        response = await list_agents(app, f"{REBINDING_PAGE}:{app.http.port}")
    assert response.status_code == 200


def test_the_listener_own_names_follow_its_addresses() -> None:
    loopback = Settings(
        http_address="127.0.0.1:8080",
        listen_address="127.0.0.1:50051",
        server={"member_advertise_address": "agio-1.internal:50052"},
    )
    assert own_host_names(loopback) == {"127.0.0.1", "localhost", "agio-1.internal"}
    named = Settings(
        http_address="agio.internal:8080", listen_address="10.0.0.5:50051", auth={"mode": "none"}
    )
    assert own_host_names(named) == {"agio.internal", "10.0.0.5"}
    everywhere = Settings(
        http_address="[::]:8080", listen_address="0.0.0.0:50051", auth={"mode": "none"}
    )
    assert own_host_names(everywhere) == {socket.gethostname().lower(), "localhost"}


@pytest.mark.parametrize(
    ("header", "host"),
    [
        ("Agio.Example.com:8080", "agio.example.com"),
        ("agio.example.com.", "agio.example.com"),
        ("[::1]:8080", "::1"),
        ("127.0.0.1", "127.0.0.1"),
    ],
)
def test_a_host_header_names_its_host_without_port(header: str, host: str) -> None:
    assert host_name(header) == host


@pytest.mark.parametrize("entry", ["http://agio.example.com", "agio.example.com:8080", "*.", ""])
def test_allowed_hosts_takes_host_names_only(entry: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="not a host name"):
        HttpConfig(allowed_hosts=[entry])


def test_the_authentication_off_warning_names_the_http_listener(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from agio_grpc.service.auth import choose_auth_mode

    settings = Settings(
        listen_address="0.0.0.0:50051", http_address="0.0.0.0:8080", auth={"mode": "none"}
    )
    with caplog.at_level(logging.WARNING):
        assert choose_auth_mode(settings) == "none"
    assert "0.0.0.0:50051 and of the HTTP listener 0.0.0.0:8080" in caplog.text


async def test_an_http2_request_names_its_host_by_authority_and_is_checked_alike(
    every_interface: AgioApp,
) -> None:
    assert every_interface.http is not None
    port = every_interface.http.port
    async with httpx2.AsyncClient(
        http1=False, http2=True, base_url=f"http://127.0.0.1:{port}"
    ) as http:
        refused = await http.post(
            LIST_AGENTS, content=b"{}", headers=CONNECT_JSON | {"host": f"{REBINDING_PAGE}:{port}"}
        )
        served = await http.post(
            LIST_AGENTS, content=b"{}", headers=CONNECT_JSON | {"host": f"localhost:{port}"}
        )
    assert refused.http_version == served.http_version == "HTTP/2"
    refused_for_host(refused, REBINDING_PAGE)
    assert served.status_code == 200
