"""The `auth` section of the settings: `AGIO_AUTH=api_key` as the short form of
`AGIO_AUTH__MODE`, nested variables beside it, the YAML file, and what `jwt` requires."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from agio_grpc.cli.serve import configuration_lines
from agio_grpc.config import Settings


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AGIO_AUTH", "AGIO_AUTH__MODE", "AGIO_CONFIG", "AGIO_SERVER__REFLECTION"):
        monkeypatch.delenv(name, raising=False)


def test_the_mode_is_unset_by_default() -> None:
    settings = Settings()
    assert settings.auth.mode is None
    assert settings.auth.api_key.cache_s == 5.0
    assert settings.auth.jwt.tenant_claim == "tenant"
    assert settings.server.reflection is None


def mutual_tls_files(monkeypatch: pytest.MonkeyPatch) -> None:
    """The settings of a mutual TLS server (the files are read at start, not here)."""
    for name in ("CERT", "KEY", "CLIENT_CA"):
        monkeypatch.setenv(f"AGIO_TLS_{name}_FILE", f"/etc/agio/{name.lower()}.pem")


@pytest.mark.parametrize("mode", ["none", "api_key", "mtls"])
def test_agio_auth_names_the_mode(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    mutual_tls_files(monkeypatch)
    monkeypatch.setenv("AGIO_AUTH", mode)
    assert Settings().auth.mode == mode


def test_mtls_needs_a_server_that_asks_for_client_certificates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AGIO_AUTH", "mtls")
    with pytest.raises(ValidationError, match="set AGIO_TLS_CLIENT_CA_FILE"):
        Settings()


def test_agio_auth_and_nested_variables_make_one_section(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGIO_AUTH", "jwt")
    monkeypatch.setenv("AGIO_AUTH__JWT__JWKS_URL", "https://issuer.example/jwks.json")
    monkeypatch.setenv("AGIO_AUTH__JWT__ISSUER", "https://issuer.example")
    monkeypatch.setenv("AGIO_AUTH__JWT__AUDIENCE", "agio-grpc")
    monkeypatch.setenv("AGIO_AUTH__JWT__ALGORITHMS", '["ES256"]')
    monkeypatch.setenv("AGIO_AUTH__API_KEY__CACHE_S", "1.5")
    auth = Settings().auth
    assert auth.mode == "jwt"
    assert auth.jwt.jwks_url == "https://issuer.example/jwks.json"
    assert (auth.jwt.issuer, auth.jwt.audience) == ("https://issuer.example", "agio-grpc")
    assert auth.jwt.algorithms == ["ES256"]
    assert auth.api_key.cache_s == 1.5


def test_the_long_forms_work_too(monkeypatch: pytest.MonkeyPatch) -> None:
    mutual_tls_files(monkeypatch)
    monkeypatch.setenv("AGIO_AUTH__MODE", "api_key")
    assert Settings().auth.mode == "api_key"
    monkeypatch.setenv("AGIO_AUTH", '{"mode": "mtls", "mtls": {"tenant_from": "san_uri"}}')
    auth = Settings().auth
    assert (auth.mode, auth.mtls.tenant_from) == ("api_key", "san_uri")  # nested wins
    monkeypatch.delenv("AGIO_AUTH__MODE")
    assert Settings().auth.mode == "mtls"


def test_the_config_file_sets_the_section_and_a_variable_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "agio.yaml"
    config.write_text(
        "auth:\n"
        "  mode: jwt\n"
        "  jwt:\n"
        "    public_key_file: /etc/agio/issuer.pem\n"
        "    issuer: https://issuer.example\n"
        "    audience: agio-grpc\n"
        "    tenant_claim: org\n"
        "server:\n"
        "  reflection: true\n"
    )
    monkeypatch.setenv("AGIO_CONFIG", str(config))
    settings = Settings()
    assert settings.auth.mode == "jwt"
    assert settings.auth.jwt.public_key_file == Path("/etc/agio/issuer.pem")
    assert settings.auth.jwt.tenant_claim == "org"
    assert settings.server.reflection is True

    monkeypatch.setenv("AGIO_AUTH__JWT__TENANT_CLAIM", "team")
    assert Settings().auth.jwt.tenant_claim == "team"


@pytest.mark.parametrize(
    ("jwt", "message"),
    [
        ({"issuer": "i", "audience": "a"}, "exactly one of auth.jwt.jwks_url"),
        (
            {"issuer": "i", "audience": "a", "jwks_url": "https://x", "public_key_file": "k.pem"},
            "exactly one of auth.jwt.jwks_url",
        ),
        ({"jwks_url": "https://x", "audience": "a"}, "auth.jwt.issuer is required"),
        ({"jwks_url": "https://x", "issuer": "i"}, "auth.jwt.audience is required"),
    ],
)
def test_jwt_needs_one_key_source_an_issuer_and_an_audience(
    jwt: dict[str, str], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        Settings(auth={"mode": "jwt", "jwt": jwt})
    Settings(auth={"mode": "api_key", "jwt": jwt})  # checked only when jwt is the mode


@pytest.mark.parametrize("algorithm", ["HS256", "none"])
def test_jwt_accepts_public_key_algorithms_only(algorithm: str) -> None:
    with pytest.raises(ValidationError, match="public-key algorithms"):
        Settings(auth={"jwt": {"algorithms": ["RS256", algorithm]}})


def test_a_bad_mode_is_one_line_naming_agio_auth(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGIO_AUTH", "password")
    with pytest.raises(ValidationError) as invalid:
        Settings()
    [line] = configuration_lines(invalid.value)
    assert line.startswith("invalid configuration: auth.mode [AGIO_AUTH]: Input should be")
