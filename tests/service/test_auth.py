"""Authentication at the edge: API keys on a real server over SQLite and PostgreSQL, health and
reflection without a credential, client certificates' names, and the refusal to start open
to the network when no mode was chosen.

Every refusal is UNAUTHENTICATED with its ErrorInfo reason, and no credential is ever in
the log.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from agio_grpc.client import AgioClient, AgioError
from agio_grpc.config import MtlsAuthConfig
from agio_grpc.service.app import AgioApp
from agio_grpc.service.auth import is_loopback
from agio_grpc.service.auth_api_key import ApiKeyVerifier
from agio_grpc.service.auth_mtls import caller_from_certificate
from agio_grpc.service.errors import ServiceError
from agio_grpc.service.identity import Caller
from agio_grpc.service.startup import StartupError
from agio_grpc.store.keys import IssuedKey, KeyStore
from agio_grpc.testing import FakeModelServer
from agio_grpc.v1 import agent_service_pb2
from tests.roles import StoreRoles
from tests.service.auth_helpers import (
    auth_settings,
    bearer,
    refusal,
    serving,
    unauthenticated,
    whoami,
)
from tests.service.test_startup_errors import serve_output
from tests.sqlite import sqlite_at

API_KEY_AUTH = {"mode": "api_key", "api_key": {"cache_s": 0}}


@pytest.fixture
async def keyed_app(store_url: str, fake_model: FakeModelServer) -> AsyncIterator[AgioApp]:
    """The service with `auth.mode: api_key` (no key cached) on the backend under test."""
    async with serving(auth_settings(store_url, fake_model.base_url, auth=API_KEY_AUTH)) as app:
        yield app


# -- API keys ------------------------------------------------------------------------------


async def test_a_key_serves_its_tenant_on_unary_and_streaming_calls(
    keyed_app: AgioApp, keys: KeyStore
) -> None:
    issued = await keys.create("acme", "ci")
    async with AgioClient(keyed_app.address, metadata=[bearer(issued.token)]) as client:
        assert [agent.name for agent in await client.list_agents()] == ["assistant"]
    seen = await whoami(keyed_app.address, bearer(issued.token))
    assert seen == f"acme|{issued.key.id}|api_key"


async def test_a_call_without_a_credential_is_refused_credentials_missing(
    keyed_app: AgioApp,
) -> None:
    error = await refusal(keyed_app.address)
    assert unauthenticated(error) == "CREDENTIALS_MISSING"
    assert error.metadata == {"mode": "api_key"}
    assert "authorization: Bearer" in error.message

    async with AgioClient(keyed_app.address) as client:
        with pytest.raises(AgioError) as streamed:
            await client.run_to_end("hello")
    assert unauthenticated(streamed.value) == "CREDENTIALS_MISSING"


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer nonsense",
        "Bearer agio_0123456789ab_no-such-key",
        "Bearer ",
        "Basic YWxhZGRpbjpvcGVuc2VzYW1l",
        "agio_0123456789ab_no-scheme",
    ],
    ids=["not-a-key", "unknown-id", "empty", "basic", "no-scheme"],
)
async def test_a_garbled_key_is_refused_credentials_invalid(
    keyed_app: AgioApp, authorization: str
) -> None:
    error = await refusal(keyed_app.address, ("authorization", authorization))
    assert unauthenticated(error) == "CREDENTIALS_INVALID"


async def test_a_key_with_a_wrong_secret_is_refused_credentials_invalid(
    keyed_app: AgioApp, keys: KeyStore
) -> None:
    issued = await keys.create("acme")
    wrong = issued.token[:-4] + ("AAAA" if not issued.token.endswith("AAAA") else "BBBB")
    error = await refusal(keyed_app.address, bearer(wrong))
    assert unauthenticated(error) == "CREDENTIALS_INVALID"


async def test_a_revoked_key_is_refused_key_revoked(keyed_app: AgioApp, keys: KeyStore) -> None:
    issued = await keys.create("acme")
    async with AgioClient(keyed_app.address, metadata=[bearer(issued.token)]) as client:
        await client.list_agents()
        await keys.revoke(issued.key.id)
        with pytest.raises(AgioError) as refused:
            await client.list_agents()
    assert unauthenticated(refused.value) == "KEY_REVOKED"
    # Only the key's holder learns it was revoked: a wrong secret is just invalid.
    wrong = issued.token[:-4] + ("AAAA" if not issued.token.endswith("AAAA") else "BBBB")
    assert unauthenticated(await refusal(keyed_app.address, bearer(wrong))) == (
        "CREDENTIALS_INVALID"
    )


async def test_no_credential_reaches_the_log(
    keyed_app: AgioApp, keys: KeyStore, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    revoked = await keys.create("acme")
    await keys.revoke(revoked.key.id)
    good = await keys.create("acme")
    wrong = good.token[:-4] + ("AAAA" if not good.token.endswith("AAAA") else "BBBB")
    presented = [revoked.token, wrong, "agio_0123456789ab_a-made-up-secret", "garbage-token"]
    for token in presented:
        await refusal(keyed_app.address, bearer(token))
    await whoami(keyed_app.address, bearer(good.token))

    assert "refused /agio.v1.AgentService/ListAgents" in caplog.text
    for token in [*presented, good.token]:
        secret = token.split("_", 2)[-1]  # agio_<id>_<secret>; a secret may hold "_"
        assert token not in caplog.text
        assert secret not in caplog.text


async def test_health_answers_without_a_credential(keyed_app: AgioApp) -> None:
    async with AgioClient(keyed_app.address) as client:
        assert await client.health() == "SERVING"
        assert await client.health("agio.v1.AgentService") == "SERVING"


async def list_services(address: str) -> list[str]:
    """The services server reflection lists (raises AioRpcError when it is not served)."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        async for response in stub.ServerReflectionInfo(iter([request]), timeout=10):
            return [service.name for service in response.list_services_response.service]
    raise AssertionError("no reflection response")


async def test_reflection_is_off_when_callers_are_authenticated(keyed_app: AgioApp) -> None:
    # The call's status, without a request: a request written after the server refused the
    # method can fail in the client (INTERNAL, "Failed execute_batch") before the status.
    async with grpc.aio.insecure_channel(keyed_app.address) as channel:
        call = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(timeout=10)
        assert await call.code() is grpc.StatusCode.UNIMPLEMENTED


async def test_reflection_is_on_without_authentication_or_when_asked_for(
    tmp_path: Path, fake_model: FakeModelServer, app: AgioApp
) -> None:
    assert "agio.v1.AgentService" in await list_services(app.address)
    settings = auth_settings(
        sqlite_at(tmp_path / "asked.db"),
        fake_model.base_url,
        auth={"mode": "api_key"},
        server={"reflection": True},
    )
    async with serving(settings) as asked:
        assert "agio.v1.SessionService" in await list_services(asked.address)


# -- the verified-key cache ----------------------------------------------------------------


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_revoked_key_is_refused_once_its_cache_expires(store: StoreRoles) -> None:
    keys = store.keys()
    issued = await keys.create("acme")
    clock = Clock()
    verifier = ApiKeyVerifier(keys, cache_s=5.0, clock=clock)
    assert await verifier.verify(issued.token) == Caller("acme", issued.key.id, "api_key")

    await keys.revoke(issued.key.id)
    clock.now += 4.9
    assert (await verifier.verify(issued.token)).tenant == "acme"  # within cache_s
    clock.now += 0.2
    with pytest.raises(ServiceError) as refused:
        await verifier.verify(issued.token)
    assert refused.value.reason == "KEY_REVOKED"
    await verifier.close()


async def test_a_keys_use_is_recorded_at_most_once_a_minute(store: StoreRoles) -> None:
    keys = store.keys()
    issued: IssuedKey = await keys.create("acme")
    clock = Clock()
    verifier = ApiKeyVerifier(keys, cache_s=0.0, clock=clock)
    for _ in range(3):
        await verifier.verify(issued.token)
    await verifier.close()  # waits for the writes under way
    first = await keys.find(issued.key.id)
    assert first is not None
    assert first.last_used_time is not None

    clock.now += 30
    await verifier.verify(issued.token)
    await verifier.close()
    assert await keys.find(issued.key.id) == first  # not written again within the minute


# -- client certificates (auth contexts as grpc 1.85 gives them) ---------------------------

CERTIFICATE = {
    "transport_security_type": [b"ssl"],
    "x509_subject": [b"CN=acme"],
    "x509_common_name": [b"acme"],
    "x509_subject_alternative_name": [
        b"client.example",
        b"spiffe://example.org/tenant/globex",
        b"https://x/y",
        b"a@b.c",
    ],
    "peer_dns": [b"client.example"],
    "peer_uri": [b"spiffe://example.org/tenant/globex", b"https://x/y"],
    "peer_email": [b"a@b.c"],
    "security_level": [b"TSI_PRIVACY_AND_INTEGRITY"],
}
NO_CERTIFICATE = {
    "transport_security_type": [b"ssl"],
    "security_level": [b"TSI_PRIVACY_AND_INTEGRITY"],
}
INSECURE = {"transport_security_type": [b"insecure"], "security_level": [b"TSI_SECURITY_NONE"]}


def test_the_tenant_is_the_certificates_common_name() -> None:
    caller = caller_from_certificate(CERTIFICATE, MtlsAuthConfig())
    assert caller == Caller("acme", "acme", "mtls")


def test_the_tenant_is_a_san_uri_less_its_prefix() -> None:
    config = MtlsAuthConfig(tenant_from="san_uri", san_uri_prefix="spiffe://example.org/tenant/")
    caller = caller_from_certificate(CERTIFICATE, config)
    assert caller == Caller("globex", "spiffe://example.org/tenant/globex", "mtls")
    without_peer_uri = {k: v for k, v in CERTIFICATE.items() if k != "peer_uri"}
    assert caller_from_certificate(without_peer_uri, config) == caller


@pytest.mark.parametrize(
    "context", [NO_CERTIFICATE, INSECURE, {}], ids=["tls", "insecure", "empty"]
)
def test_a_call_without_a_client_certificate_is_credentials_missing(
    context: dict[str, list[bytes]],
) -> None:
    with pytest.raises(ServiceError) as refused:
        caller_from_certificate(context, MtlsAuthConfig())
    assert (refused.value.code, refused.value.reason) == (
        grpc.StatusCode.UNAUTHENTICATED,
        "CREDENTIALS_MISSING",
    )


@pytest.mark.parametrize(
    ("context", "config"),
    [
        (CERTIFICATE, MtlsAuthConfig(tenant_from="san_uri", san_uri_prefix="spiffe://other/")),
        ({"x509_subject": [b""], "peer_uri": [b"spiffe://x/y"]}, MtlsAuthConfig()),
        ({"x509_subject": [b"CN=\xff"], "x509_common_name": [b"\xff"]}, MtlsAuthConfig()),
        ({"x509_subject": [b"CN= padded "], "x509_common_name": [b" padded "]}, MtlsAuthConfig()),
    ],
    ids=["no-uri-with-prefix", "no-common-name", "not-utf8", "spaces"],
)
def test_a_certificate_naming_no_tenant_is_credentials_invalid(
    context: dict[str, list[bytes]], config: MtlsAuthConfig
) -> None:
    with pytest.raises(ServiceError) as refused:
        caller_from_certificate(context, config)
    assert refused.value.reason == "CREDENTIALS_INVALID"


# -- choosing a mode -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1:50051", True),
        ("127.0.0.2:0", True),
        ("localhost:50051", True),
        ("[::1]:50051", True),
        ("0.0.0.0:50051", False),
        ("[::]:50051", False),
        (":50051", False),
        ("10.1.2.3:50051", False),
        ("agio.example.com:50051", False),
    ],
)
def test_only_loopback_addresses_are_loopback(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


async def test_no_mode_on_an_address_others_reach_refuses_to_start(tmp_path: Path) -> None:
    settings = auth_settings(
        f"sqlite+aiosqlite:///{tmp_path / 'agio.db'}",  # a new file: it must not be made
        "http://127.0.0.1:9/v1",
        listen_address="0.0.0.0:0",
    )
    with pytest.raises(StartupError) as refused:
        await AgioApp.start(settings)
    assert refused.value.setting == "AGIO_AUTH"
    assert "0.0.0.0:0" in refused.value.what
    for choice in ("api_key", "jwt", "mtls", "none"):
        assert choice in refused.value.fix
    assert not (tmp_path / "agio.db").exists()  # refused before anything opened


@pytest.mark.slow  # a real `agio-grpc serve` process
async def test_serve_refuses_in_one_line_naming_agio_auth(tmp_path: Path) -> None:
    code, stderr = await serve_output(tmp_path, {"AGIO_LISTEN_ADDRESS": "0.0.0.0:0"})
    assert code == 2
    [line] = stderr.splitlines()
    assert line.startswith("agio-grpc: cannot start: no authentication chosen for 0.0.0.0:0")
    assert "[AGIO_AUTH]" in line


async def test_an_explicit_none_serves_everyone_with_a_warning(
    tmp_path: Path, fake_model: FakeModelServer, caplog: pytest.LogCaptureFixture
) -> None:
    settings = auth_settings(
        sqlite_at(tmp_path / "agio.db"),
        fake_model.base_url,
        listen_address="0.0.0.0:0",
        auth={"mode": "none"},
    )
    async with serving(settings) as app:
        port = app.port
        assert await whoami(f"127.0.0.1:{port}") == "default||none"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("authentication is off (AGIO_AUTH=none)" in line for line in warnings)


async def test_unset_on_loopback_is_none(app: AgioApp) -> None:
    async with AgioClient(app.address) as client:
        request = agent_service_pb2.ListAgentsRequest()
        assert (await client.agents.ListAgents(request)).agents
