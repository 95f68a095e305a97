"""TLS and mutual TLS: who gets in, certificate rotation under open streams (in process and
by SIGHUP to `agio-grpc serve`), and the start-up errors of TLS files that cannot serve."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from pydantic import ValidationError

from agio_grpc.cli.serve import configuration_lines
from agio_grpc.client import TLS_HINTS, AgioClient, AgioError, TlsConfig, TlsFailure
from agio_grpc.config import Settings
from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer, Turn
from agio_grpc.testing.certificates import CertificateAuthority
from agio_grpc.v1 import events_pb2, resources_pb2
from tests.service.auth_helpers import WHOAMI, auth_settings, serving
from tests.service.conftest import make_settings
from tests.service.pki import Pki, served_certificate
from tests.service.test_serve import LISTENING, read_until, spawn_serve
from tests.service.test_startup_errors import start_fails
from tests.sqlite import sqlite_at

QUESTION = "What is 12 * 7?"


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki.create(tmp_path / "tls")


async def start_app(
    tmp_path: Path, fake_model: FakeModelServer, pki: Pki, *, mutual: bool = False
) -> AgioApp:
    database_url = sqlite_at(tmp_path / "agio.db")
    settings = make_settings(
        database_url, fake_model.base_url, **pki.server_settings(mutual=mutual)
    )
    return await AgioApp.start(settings)


@pytest.fixture
async def tls_app(tmp_path: Path, fake_model: FakeModelServer, pki: Pki) -> AsyncIterator[AgioApp]:
    app = await start_app(tmp_path, fake_model, pki)
    try:
        yield app
    finally:
        await app.stop(grace=0)


@pytest.fixture
async def mtls_app(tmp_path: Path, fake_model: FakeModelServer, pki: Pki) -> AsyncIterator[AgioApp]:
    app = await start_app(tmp_path, fake_model, pki, mutual=True)
    try:
        yield app
    finally:
        await app.stop(grace=0)


async def refusal(address: str, **client: Any) -> AgioError:
    """The error a health check ends with, for a client that must not get in."""
    async with AgioClient(address, **client) as outsider:
        with pytest.raises(AgioError) as failed:
            await outsider.health()
    return failed.value


async def refused(address: str, **client: Any) -> grpc.StatusCode:
    """The status a health check ends with, for a client that must not get in."""
    return (await refusal(address, **client)).code


def stop_reason(event: events_pb2.StepEvent) -> str:
    kind = event.WhichOneof("event")
    assert kind in ("run_completed", "run_failed"), f"not a terminal event: {kind}"
    return resources_pb2.StopReason.Name(getattr(event, kind).run.stop_signal.reason)


# -- who gets in ---------------------------------------------------------------------------


async def test_a_tls_client_runs_and_a_plaintext_client_is_refused(
    tls_app: AgioApp, pki: Pki
) -> None:
    async with AgioClient(tls_app.address, tls=pki.client_tls()) as client:
        result = await client.run_to_end(QUESTION)
    assert "84" in result.text
    assert await refused(tls_app.address) == grpc.StatusCode.UNAVAILABLE


async def test_a_client_that_does_not_trust_the_servers_ca_is_refused(
    tls_app: AgioApp, tmp_path: Path
) -> None:
    stranger = Pki.create(tmp_path / "other", "another CA")
    assert await refused(tls_app.address, tls=stranger.client_tls()) == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls_refuses_a_client_without_a_certificate_of_its_ca(
    mtls_app: AgioApp, pki: Pki, tmp_path: Path
) -> None:
    assert await refused(mtls_app.address, tls=pki.client_tls()) == grpc.StatusCode.UNAVAILABLE
    # A certificate signed by a CA the server does not take is no better than none.
    stranger = Pki.create(tmp_path / "other", "another CA")
    wrong_certificate = TlsConfig(
        ca_file=pki.ca_file,
        cert_file=stranger.directory / "client.pem",
        key_file=stranger.directory / "client.key",
    )
    assert await refused(mtls_app.address, tls=wrong_certificate) == grpc.StatusCode.UNAVAILABLE
    assert await refused(mtls_app.address) == grpc.StatusCode.UNAVAILABLE

    async with AgioClient(mtls_app.address, tls=pki.client_tls(with_certificate=True)) as client:
        result = await client.run_to_end(QUESTION)
    assert "84" in result.text


async def test_each_tls_mistake_of_a_client_says_what_to_change(
    mtls_app: AgioApp, pki: Pki, tmp_path: Path, fake_model: FakeModelServer
) -> None:
    stranger = Pki.create(tmp_path / "other", "another CA")
    plaintext = make_settings(sqlite_at(tmp_path / "plain.db"), fake_model.base_url)
    async with serving(plaintext) as plaintext_app:
        mistakes = {
            TlsFailure.SERVER_WANTS_TLS: (mtls_app.address, {}),
            TlsFailure.UNTRUSTED_CERTIFICATE: (mtls_app.address, {"tls": stranger.client_tls()}),
            TlsFailure.HANDSHAKE_REFUSED: (mtls_app.address, {"tls": pki.client_tls()}),
            TlsFailure.SERVER_WITHOUT_TLS: (plaintext_app.address, {"tls": pki.client_tls()}),
        }
        for failure, (address, client) in mistakes.items():
            error = await refusal(address, **client)
            assert error.code is grpc.StatusCode.UNAVAILABLE
            assert error.tls_failure is failure, error
            assert str(error).endswith(f"({failure.value}: {TLS_HINTS[failure]})")
    assert "TlsConfig(ca_file=...)" in str(await refusal(mtls_app.address))


async def test_an_address_nobody_listens_on_is_no_tls_failure(pki: Pki) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{unused.getsockname()[1]}"
    for tls in (False, pki.client_tls()):
        error = await refusal(address, tls=tls)
        assert error.code is grpc.StatusCode.UNAVAILABLE
        assert error.tls_failure is None


# -- rotation ------------------------------------------------------------------------------


async def test_a_reload_serves_the_new_certificate_to_new_connections_under_an_open_stream(
    tls_app: AgioApp, pki: Pki, fake_model: FakeModelServer
) -> None:
    first = await served_certificate(tls_app.address, pki.ca.cert_pem)
    assert first.serial_number == pki.server.serial
    fake_model.enqueue(Turn.hanging())  # the run lasts until it is cancelled
    async with AgioClient(tls_app.address, tls=pki.client_tls()) as opened_before:
        stream = opened_before.run("Wait for the rotation.", timeout=30)
        started = await anext(aiter(stream))
        assert started.WhichOneof("event") == "run_started"

        rotated = pki.rotate_server()
        assert tls_app.reload_certificates()
        served = await served_certificate(tls_app.address, pki.ca.cert_pem)
        assert served.serial_number == rotated.serial != first.serial_number
        async with AgioClient(tls_app.address, tls=pki.client_tls()) as opened_after:
            await opened_after.cancel_run(started.run_id, "rotated")

        rest = [event async for event in stream]
    assert stop_reason(rest[-1]) == "STOP_REASON_CANCELLED"


async def test_a_reload_with_files_that_fail_their_checks_keeps_the_current_certificate(
    tls_app: AgioApp, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    other_key = pki.ca.issue_server().key_pem
    pki.server_key.write_bytes(other_key)  # the certificate stays: the key does not match
    with caplog.at_level(logging.ERROR, logger="agio_grpc.service.tls"):
        assert not tls_app.reload_certificates()
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert line.startswith("TLS files not reloaded, new connections still get CN=localhost")
    assert "[AGIO_TLS_KEY_FILE]" in line
    served = await served_certificate(tls_app.address, pki.ca.cert_pem)
    assert served.serial_number == pki.server.serial
    async with AgioClient(tls_app.address, tls=pki.client_tls()) as client:
        assert await client.health() == "SERVING"


@pytest.mark.slow  # a real `agio-grpc serve` process
async def test_sighup_to_serve_rotates_the_certificate_and_an_open_watch_goes_on(
    tmp_path: Path, fake_model: FakeModelServer, pki: Pki
) -> None:
    process = await spawn_serve(
        tmp_path,
        {
            "AGIO_DATABASE_URL": sqlite_at(tmp_path / "agio.db"),
            "OPENAI_BASE_URL": fake_model.base_url,
            "OPENAI_API_KEY": "test-key",
            "AGIO_TLS_CERT_FILE": str(pki.server_cert),
            "AGIO_TLS_KEY_FILE": str(pki.server_key),
        },
    )
    assert process.stderr is not None
    try:
        log, address = await read_until(process.stderr, LISTENING)
        assert re.search(r"listening on \S+ \(TLS: CN=localhost, serial [0-9a-f]+, valid", log)
        fake_model.enqueue(Turn.hanging())
        old_ca = TlsConfig(ca_file=pki.ca_file)
        async with AgioClient(address, tls=old_ca) as opened_before:
            run = await opened_before.start_run("Wait for the rotation.")
            watch = aiter(opened_before.watch_run(run.id, timeout=60))
            assert (await anext(watch)).WhichOneof("event") == "run_started"

            # The new certificate comes from a new CA: a new connection that trusts only
            # the old one can no longer get in, one that trusts only the new one can.
            new_ca = CertificateAuthority("rotated CA")
            new_ca_file = new_ca.write(pki.directory, "new-ca")
            rotated = pki.rotate_server(new_ca)
            process.send_signal(signal.SIGHUP)
            reloaded, _ = await read_until(process.stderr, re.compile(r"TLS files (reloaded)"))
            assert f"serial {rotated.serial:x}" in reloaded

            served = await served_certificate(address, new_ca.cert_pem)
            assert served.serial_number == rotated.serial
            assert await refused(address, tls=old_ca) == grpc.StatusCode.UNAVAILABLE
            async with AgioClient(address, tls=TlsConfig(ca_file=new_ca_file)) as opened_after:
                assert await opened_after.health() == "SERVING"
                await opened_after.cancel_run(run.id, "rotated")

            rest = [event async for event in watch]
        assert stop_reason(rest[-1]) == "STOP_REASON_CANCELLED"
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


# -- start-up errors -----------------------------------------------------------------------


def tls_files_with(pki: Pki, tmp_path: Path, **replaced: bytes) -> dict[str, Path]:
    """The server's TLS settings, with the named files (cert, key, client_ca) written anew
    with the given contents."""
    settings = pki.server_settings(mutual=True)
    for name, content in replaced.items():
        path = tmp_path / f"replaced-{name}.pem"
        path.write_bytes(content)
        settings[f"tls_{name}_file"] = path
    return settings


ENCRYPTED_KEY = ec.generate_private_key(ec.SECP256R1()).private_bytes(
    serialization.Encoding.PEM,
    serialization.PrivateFormat.PKCS8,
    serialization.BestAvailableEncryption(b"passphrase"),
)


@pytest.mark.parametrize(
    ("replaced", "what", "setting"),
    [
        ({"cert": b"not a certificate"}, r"\S+ holds no PEM certificate", "AGIO_TLS_CERT_FILE"),
        ({"key": b"not a key"}, r"\S+ holds no PEM private key", "AGIO_TLS_KEY_FILE"),
        ({"key": ENCRYPTED_KEY}, r"the key in \S+ is encrypted", "AGIO_TLS_KEY_FILE"),
        (
            {"client_ca": b"-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"},
            r"\S+ holds no PEM certificate",
            "AGIO_TLS_CLIENT_CA_FILE",
        ),
    ],
    ids=["cert-not-pem", "key-not-pem", "key-encrypted", "client-ca-not-pem"],
)
async def test_a_tls_file_that_does_not_parse_names_its_setting(
    tmp_path: Path, pki: Pki, replaced: dict[str, bytes], what: str, setting: str
) -> None:
    error = await start_fails(tmp_path, **tls_files_with(pki, tmp_path, **replaced))
    assert re.fullmatch(what, error.what), error.what
    assert error.setting == setting
    assert "\n" not in str(error)


async def test_a_key_that_is_not_the_certificates_names_the_key_setting(
    tmp_path: Path, pki: Pki
) -> None:
    other_key = pki.ca.issue_server().key_pem
    error = await start_fails(tmp_path, **tls_files_with(pki, tmp_path, key=other_key))
    assert error.what.startswith("the key in ")
    assert error.what.endswith(f"is not the one of the certificate in {pki.server_cert}")
    assert error.setting == "AGIO_TLS_KEY_FILE"
    assert "give the private key of the certificate in AGIO_TLS_CERT_FILE" in error.fix


@pytest.mark.parametrize("name", ["cert", "key", "client_ca"])
async def test_a_tls_file_that_cannot_be_read_names_its_setting(
    tmp_path: Path, pki: Pki, name: str
) -> None:
    missing = tmp_path / "missing.pem"
    settings = pki.server_settings(mutual=True) | {f"tls_{name}_file": missing}
    error = await start_fails(tmp_path, **settings)
    assert str(error) == (
        f"cannot read {missing}: No such file or directory [AGIO_TLS_{name.upper()}_FILE]: "
        "give the path of a file the server's user may read"
    )
    # A directory is no better (and root, which reads anything, sees the same).
    error = await start_fails(tmp_path, **settings | {f"tls_{name}_file": tmp_path})
    assert error.what == f"cannot read {tmp_path}: Is a directory"


def test_a_certificate_without_its_key_is_a_configuration_error() -> None:
    with pytest.raises(ValidationError) as failed:
        Settings(tls_cert_file=Path("server.pem"))
    assert configuration_lines(failed.value) == [
        "invalid configuration: tls_key_file [AGIO_TLS_KEY_FILE]: tls_cert_file is set: set "
        "this to its private key (or unset both)"
    ]
    with pytest.raises(ValidationError) as failed:
        Settings(tls_client_ca_file=Path("ca.pem"))
    assert configuration_lines(failed.value) == [
        "invalid configuration: tls_client_ca_file [AGIO_TLS_CLIENT_CA_FILE]: mutual TLS "
        "needs the server's own tls_cert_file and tls_key_file"
    ]


@pytest.mark.slow  # a real `agio-grpc serve` process
async def test_serve_with_a_missing_certificate_prints_one_line_and_exits_2(
    tmp_path: Path, pki: Pki
) -> None:
    process = await spawn_serve(
        tmp_path,
        {
            "AGIO_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'agio.db'}",  # must not be made
            "AGIO_TLS_CERT_FILE": str(tmp_path / "missing.pem"),
            "AGIO_TLS_KEY_FILE": str(pki.server_key),
        },
    )
    _, stderr = await process.communicate()
    assert process.returncode == 2
    assert stderr.decode().splitlines() == [
        f"agio-grpc: cannot start: cannot read {tmp_path / 'missing.pem'}: No such file or "
        "directory [AGIO_TLS_CERT_FILE]: give the path of a file the server's user may read"
    ]
    assert not (tmp_path / "agio.db").exists()  # checked before the store opens


# -- the client's credential ---------------------------------------------------------------


class RecordMetadata(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Keeps the invocation metadata of every call."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str | bytes]] = []

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        self.seen.append(dict(details.invocation_metadata))
        return await continuation(details)


async def test_the_clients_token_rides_every_call_as_a_bearer_credential(
    tls_app: AgioApp, pki: Pki
) -> None:
    from grpc_health.v1 import health_pb2_grpc
    from grpc_health.v1._async import HealthServicer

    recorder = RecordMetadata()
    server = grpc.aio.server(interceptors=[recorder])
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with AgioClient(f"127.0.0.1:{port}", token="s3cret") as client:
            assert await client.health() == "SERVING"
    finally:
        await server.stop(0)
    assert recorder.seen[-1]["authorization"] == "Bearer s3cret"
    # Over TLS, the same (the server ignores it until authentication is configured).
    async with AgioClient(tls_app.address, tls=pki.client_tls(), token="s3cret") as client:
        assert await client.health() == "SERVING"


async def test_mutual_tls_auth_takes_the_tenant_from_the_client_certificate(
    tmp_path: Path, fake_model: FakeModelServer, pki: Pki
) -> None:
    """`auth.mode: mtls` over mutual TLS: the run serves the tenant its certificate names."""
    acme = pki.ca.issue_client("acme")
    cert_file, key_file = acme.write(pki.directory, "acme")
    settings = auth_settings(
        sqlite_at(tmp_path / "agio.db"),
        fake_model.base_url,
        auth={"mode": "mtls"},
        **pki.server_settings(mutual=True),
    )
    app = await AgioApp.start(settings)
    try:
        tls = TlsConfig(ca_file=pki.ca_file, cert_file=cert_file, key_file=key_file)
        async with AgioClient(app.address, tls=tls) as client:
            result = await client.run_to_end(WHOAMI)
        [tool_step] = [step for step in result.steps if step.name == "whoami"]
        assert tool_step.content.startswith("acme|")
        assert tool_step.content.endswith("|mtls")
        assert await refused(app.address, tls=pki.client_tls()) is grpc.StatusCode.UNAVAILABLE
    finally:
        await app.stop(grace=0)
