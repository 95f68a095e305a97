"""How the CLI reaches a server that wants TLS, a client certificate and a token: from its
flags or from AGIO_CA_FILE, AGIO_CERT_FILE, AGIO_KEY_FILE and AGIO_TOKEN, never showing the
token."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agio_grpc.service.app import AgioApp
from agio_grpc.testing import FakeModelServer
from tests.cli.conftest import Cli
from tests.service.pki import Pki
from tests.service.test_tls import start_app

QUESTION = "What is 12 * 7?"
TOKEN = "agio-secret-token-1234"


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return Pki.create(tmp_path / "tls")


@pytest.fixture
async def mtls_cli(
    tmp_path: Path,
    fake_model: FakeModelServer,
    pki: Pki,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> AsyncIterator[Cli]:
    """The CLI against a server that asks for a client certificate of `pki`'s CA."""
    app: AgioApp = await start_app(tmp_path, fake_model, pki, mutual=True)
    try:
        yield Cli(app.address, capsys, monkeypatch)
    finally:
        await app.stop(grace=0)


def client_files(pki: Pki) -> dict[str, str]:
    return {
        "ca-file": str(pki.ca_file),
        "cert-file": str(pki.directory / "client.pem"),
        "key-file": str(pki.directory / "client.key"),
    }


async def test_chat_over_mutual_tls_with_files_and_token_as_flags(mtls_cli: Cli, pki: Pki) -> None:
    flags = [part for name, path in client_files(pki).items() for part in (f"--{name}", path)]
    result = await mtls_cli("chat", QUESTION, *flags, "--token", TOKEN)
    assert result.code == 0, result.err
    assert "The result is 84." in result.out
    assert TOKEN not in result.out + result.err


async def test_chat_over_mutual_tls_with_files_and_token_from_the_environment(
    mtls_cli: Cli, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, path in client_files(pki).items():
        monkeypatch.setenv("AGIO_" + name.upper().replace("-", "_"), path)
    monkeypatch.setenv("AGIO_TOKEN", TOKEN)
    result = await mtls_cli("chat", QUESTION, "--json")
    assert result.code == 0, result.err
    assert "84" in result.out
    help_text = await mtls_cli("chat", "--help", address=False)
    assert help_text.code == 0
    assert "--token" in help_text.out
    assert TOKEN not in help_text.out


async def test_a_client_without_its_certificate_is_refused_in_one_line_naming_the_options(
    mtls_cli: Cli, pki: Pki
) -> None:
    result = await mtls_cli("agents", "--ca-file", str(pki.ca_file))
    assert result.code == 1
    [line] = result.err.splitlines()
    assert line.startswith("agio-grpc: UNAVAILABLE: ")
    assert line.endswith(
        "(the server refused the TLS handshake: with mutual TLS it wants a client "
        "certificate a CA it accepts signed: --cert-file and --key-file (AGIO_CERT_FILE, "
        "AGIO_KEY_FILE); and --ca-file (AGIO_CA_FILE) for the server's CA)"
    )


async def test_a_plaintext_client_of_a_tls_server_is_told_to_give_the_ca_file(
    mtls_cli: Cli,
) -> None:
    result = await mtls_cli("agents")
    assert result.code == 1
    [line] = result.err.splitlines()
    assert line.startswith("agio-grpc: UNAVAILABLE: ")
    assert line.endswith(
        "(the server may speak TLS: give the CA that signed its certificate with --ca-file "
        "or AGIO_CA_FILE (--tls for a public CA))"
    )


async def test_a_client_that_does_not_trust_the_servers_ca_is_told_to_give_it(
    mtls_cli: Cli, tmp_path: Path
) -> None:
    stranger = Pki.create(tmp_path / "other", "another CA")
    result = await mtls_cli("agents", "--ca-file", str(stranger.ca_file))
    assert result.code == 1
    [line] = result.err.splitlines()
    assert "CERTIFICATE_VERIFY_FAILED" in line
    assert line.endswith(
        "(the server's certificate is not signed by a CA the client trusts: give the CA that "
        "signed it with --ca-file or AGIO_CA_FILE)"
    )


async def test_a_tls_client_of_a_plaintext_server_is_told_to_leave_tls_out(
    cli: Cli, pki: Pki
) -> None:
    result = await cli("agents", "--ca-file", str(pki.ca_file))
    assert result.code == 1
    [line] = result.err.splitlines()
    assert line.endswith(
        "(the server speaks plaintext: leave out --tls, --ca-file and AGIO_CA_FILE)"
    )


async def test_tls_files_that_cannot_be_used_are_a_usage_error(mtls_cli: Cli, pki: Pki) -> None:
    result = await mtls_cli("agents", "--cert-file", str(pki.directory / "client.pem"))
    assert (result.code, result.err) == (
        2,
        "agio-grpc: a client certificate goes with its key: give both or neither\n",
    )
    missing = pki.directory / "missing.pem"
    result = await mtls_cli("agents", "--ca-file", str(missing))
    assert (result.code, result.err) == (
        2,
        f"agio-grpc: cannot read the CA file {missing}: No such file or directory\n",
    )
