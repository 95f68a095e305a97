"""`auth.mode: jwt` on a real server: tokens signed with RSA keys made here, the key set served
by an aiohttp server on 127.0.0.1:0 that counts its fetches, or one PEM public key file.

Expired, wrong-audience, wrong-issuer, not-yet-valid and unknown-`kid` tokens are refused
UNAUTHENTICATED with their reason; a key the issuer publishes later is found by fetching the
set again, at most every `jwks_refresh_min_interval_s`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import grpc
import jwt
import pytest
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from agio_grpc.client import AgioClient
from agio_grpc.config import JwtAuthConfig
from agio_grpc.service.app import AgioApp
from agio_grpc.service.auth_jwt import JwksKeys, JwtVerifier, parse_jwks
from agio_grpc.service.startup import StartupError
from agio_grpc.testing import FakeModelServer
from tests.service.auth_helpers import (
    auth_settings,
    bearer,
    refusal,
    serving,
    unauthenticated,
    whoami,
)
from tests.sqlite import sqlite_at

ISSUER = "https://issuer.example"
AUDIENCE = "agio-grpc"


@dataclass
class SigningKey:
    kid: str
    private: rsa.RSAPrivateKey = field(
        default_factory=lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048)
    )

    def jwk(self) -> dict[str, Any]:
        public: dict[str, Any] = RSAAlgorithm.to_jwk(self.private.public_key(), as_dict=True)
        return public | {"kid": self.kid, "alg": "RS256", "use": "sig"}

    def pem(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def sign(self, kid: str | None = None, **claims: Any) -> str:
        now = int(time.time())
        payload = {"iss": ISSUER, "aud": AUDIENCE, "sub": "user-1", "iat": now, "exp": now + 300}
        payload |= claims
        headers = {"kid": self.kid if kid is None else kid}
        return jwt.encode(payload, self.private, algorithm="RS256", headers=headers)


class PublishedKey(Protocol):
    def jwk(self) -> dict[str, Any]: ...


class JwksServer:
    """The issuer's key set over HTTP; `keys` may change while it serves."""

    def __init__(self) -> None:
        self.keys: list[PublishedKey] = []
        self.fetches = 0
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def serve(self, request: web.Request) -> web.Response:
        self.fetches += 1
        return web.json_response({"keys": [key.jwk() for key in self.keys]})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/.well-known/jwks.json", self.serve)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}/.well-known/jwks.json"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


@pytest.fixture(scope="module")
def first_key() -> SigningKey:
    return SigningKey("key-1")


@pytest.fixture(scope="module")
def second_key() -> SigningKey:
    return SigningKey("key-2")


@pytest.fixture
async def issuer(first_key: SigningKey) -> AsyncIterator[JwksServer]:
    server = JwksServer()
    server.keys = [first_key]
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def jwt_auth(**jwt_settings: Any) -> dict[str, Any]:
    return {"mode": "jwt", "jwt": {"issuer": ISSUER, "audience": AUDIENCE} | jwt_settings}


@pytest.fixture
async def jwt_app(
    tmp_path: Path, fake_model: FakeModelServer, issuer: JwksServer
) -> AsyncIterator[AgioApp]:
    """The service checking JWTs against `issuer`'s key set, fetched again for an unknown
    key id at most once an hour."""
    auth = jwt_auth(jwks_url=issuer.url, jwks_refresh_min_interval_s=3600)
    settings = auth_settings(sqlite_at(tmp_path / "agio.db"), fake_model.base_url, auth=auth)
    async with serving(settings) as app:
        yield app


async def test_a_valid_token_serves_the_tenant_its_claim_names(
    jwt_app: AgioApp, first_key: SigningKey
) -> None:
    token = first_key.sign(tenant="acme")
    assert await whoami(jwt_app.address, bearer(token)) == "acme|user-1|jwt"
    # Without the tenant claim, the subject is the tenant.
    assert await whoami(jwt_app.address, bearer(first_key.sign())) == "user-1|user-1|jwt"


async def test_the_key_set_is_fetched_once_for_many_calls(
    jwt_app: AgioApp, issuer: JwksServer, first_key: SigningKey
) -> None:
    async with AgioClient(jwt_app.address, metadata=[bearer(first_key.sign())]) as client:
        for _ in range(5):
            await client.list_agents()
    assert issuer.fetches == 1


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"exp": int(time.time()) - 120}, "CREDENTIALS_EXPIRED"),
        ({"aud": "another-service"}, "CREDENTIALS_INVALID"),
        ({"iss": "https://impostor.example"}, "CREDENTIALS_INVALID"),
        ({"nbf": int(time.time()) + 3600}, "CREDENTIALS_INVALID"),
        ({"tenant": ""}, "CREDENTIALS_INVALID"),
    ],
    ids=["expired", "wrong-audience", "wrong-issuer", "not-yet-valid", "empty-tenant"],
)
async def test_a_token_failing_a_check_is_refused_with_its_reason(
    jwt_app: AgioApp,
    first_key: SigningKey,
    claims: dict[str, Any],
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    token = first_key.sign(**claims)
    error = await refusal(jwt_app.address, bearer(token))
    assert unauthenticated(error) == reason
    assert error.metadata == {"mode": "jwt"}
    assert "refused /agio.v1.AgentService/ListAgents" in caplog.text
    for part in token.split("."):  # header, claims, signature: none in the answer or the log
        assert part not in error.message
        assert part not in caplog.text


async def test_a_token_without_an_expiry_is_refused(
    jwt_app: AgioApp, first_key: SigningKey
) -> None:
    now = int(time.time())
    token = jwt.encode(
        {"iss": ISSUER, "aud": AUDIENCE, "sub": "user-1", "iat": now},
        first_key.private,
        algorithm="RS256",
        headers={"kid": first_key.kid},
    )
    error = await refusal(jwt_app.address, bearer(token))
    assert unauthenticated(error) == "CREDENTIALS_INVALID"
    assert "no exp claim" in error.message


async def test_an_unknown_kid_is_refused_after_one_fetch_of_the_set(
    jwt_app: AgioApp, issuer: JwksServer, first_key: SigningKey, second_key: SigningKey
) -> None:
    await whoami(jwt_app.address, bearer(first_key.sign()))
    assert issuer.fetches == 1
    # A key the issuer does not publish: the set is fetched again, once an hour at most.
    for _ in range(3):
        error = await refusal(jwt_app.address, bearer(second_key.sign()))
        assert unauthenticated(error) == "CREDENTIALS_INVALID"
        assert "kid" in error.message
    assert issuer.fetches == 1  # fetched at the first call, within the hour since


async def test_a_key_published_later_is_found_by_fetching_the_set_again(
    tmp_path: Path,
    fake_model: FakeModelServer,
    issuer: JwksServer,
    first_key: SigningKey,
    second_key: SigningKey,
) -> None:
    auth = jwt_auth(jwks_url=issuer.url, jwks_refresh_min_interval_s=0)
    settings = auth_settings(sqlite_at(tmp_path / "agio.db"), fake_model.base_url, auth=auth)
    async with serving(settings) as app:
        await refusal(app.address)  # nothing fetched without a token
        assert await whoami(app.address, bearer(first_key.sign(tenant="acme"))) == (
            "acme|user-1|jwt"
        )
        error = await refusal(app.address, bearer(second_key.sign()))
        assert unauthenticated(error) == "CREDENTIALS_INVALID"
        fetched = issuer.fetches

        issuer.keys = [first_key, second_key]  # the issuer rotates its keys
        token = second_key.sign(tenant="globex")
        assert await whoami(app.address, bearer(token)) == "globex|user-1|jwt"
        assert issuer.fetches == fetched + 1


@pytest.mark.parametrize(
    "token",
    ["not-a-jwt", "a.b.c", ""],
    ids=["garbage", "three-parts", "empty"],
)
async def test_a_garbled_token_is_refused_credentials_invalid(jwt_app: AgioApp, token: str) -> None:
    error = await refusal(jwt_app.address, ("authorization", f"Bearer {token}"))
    assert unauthenticated(error) == "CREDENTIALS_INVALID"


async def test_a_forged_signature_or_an_unsigned_token_is_refused(
    jwt_app: AgioApp, first_key: SigningKey, second_key: SigningKey
) -> None:
    forged = second_key.sign(kid=first_key.kid)  # names key-1, signed with key-2
    error = await refusal(jwt_app.address, bearer(forged))
    assert unauthenticated(error) == "CREDENTIALS_INVALID"
    assert "signature does not verify" in error.message

    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "x", "exp": now + 60}
    unsigned = jwt.encode(claims, "", algorithm="none", headers={"kid": first_key.kid})
    error = await refusal(jwt_app.address, bearer(unsigned))
    assert unauthenticated(error) == "CREDENTIALS_INVALID"


async def test_a_key_set_that_cannot_be_fetched_makes_calls_unavailable(
    tmp_path: Path, fake_model: FakeModelServer, first_key: SigningKey
) -> None:
    gone = JwksServer()
    await gone.start()
    await gone.stop()  # its port now refuses connections
    settings = auth_settings(
        sqlite_at(tmp_path / "agio.db"),
        fake_model.base_url,
        auth=jwt_auth(jwks_url=gone.url),
    )
    async with serving(settings) as app:
        error = await refusal(app.address, bearer(first_key.sign()))
    assert error.code is grpc.StatusCode.UNAVAILABLE
    assert error.reason == "AUTHENTICATION_UNAVAILABLE"


async def test_a_pem_public_key_file_verifies_tokens(
    tmp_path: Path, fake_model: FakeModelServer, first_key: SigningKey, second_key: SigningKey
) -> None:
    pem = tmp_path / "issuer.pem"
    pem.write_bytes(first_key.pem())
    settings = auth_settings(
        sqlite_at(tmp_path / "agio.db"),
        fake_model.base_url,
        auth=jwt_auth(public_key_file=str(pem)),
    )
    async with serving(settings) as app:
        token = first_key.sign(kid="whatever", tenant="acme")
        assert await whoami(app.address, bearer(token)) == "acme|user-1|jwt"
        error = await refusal(app.address, bearer(second_key.sign()))
        assert unauthenticated(error) == "CREDENTIALS_INVALID"
        expired = first_key.sign(exp=int(time.time()) - 120)
        assert unauthenticated(await refusal(app.address, bearer(expired))) == (
            "CREDENTIALS_EXPIRED"
        )


@pytest.mark.parametrize("content", [None, b"not a key"], ids=["missing", "not-pem"])
async def test_a_public_key_file_that_cannot_be_read_refuses_to_start(
    tmp_path: Path, content: bytes | None
) -> None:
    pem = tmp_path / "issuer.pem"
    if content is not None:
        pem.write_bytes(content)
    settings = auth_settings(
        sqlite_at(tmp_path / "agio.db"),
        "http://127.0.0.1:9/v1",
        auth=jwt_auth(public_key_file=str(pem)),
    )
    with pytest.raises(StartupError) as refused:
        await AgioApp.start(settings)
    assert refused.value.setting == "AGIO_AUTH__JWT__PUBLIC_KEY_FILE"
    assert str(pem) in refused.value.what


# -- verified tokens remembered ------------------------------------------------------------


class CountingKey:
    """One key, counting how often a verification asked for it."""

    def __init__(self, key: SigningKey) -> None:
        self._key = key.private.public_key()
        self.asked = 0

    async def key_for(self, kid: str | None) -> Any:
        self.asked += 1
        return self._key

    async def close(self) -> None:
        return None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def verifier(keys: CountingKey, clock: Clock, **jwt_settings: Any) -> JwtVerifier:
    config = JwtAuthConfig(issuer=ISSUER, audience=AUDIENCE, jwks_url="unused", **jwt_settings)
    return JwtVerifier(config, keys, clock=clock)


async def test_a_token_is_checked_once_within_cache_s(first_key: SigningKey) -> None:
    keys, clock = CountingKey(first_key), Clock()
    checker = verifier(keys, clock, cache_s=60)
    token = first_key.sign(tenant="acme")
    for _ in range(3):
        assert (await checker.verify(token)).tenant == "acme"
    assert keys.asked == 1
    clock.now += 60
    await checker.verify(token)
    assert keys.asked == 2
    other = first_key.sign(tenant="globex")
    assert (await checker.verify(other)).tenant == "globex"  # by its exact text
    assert keys.asked == 3


async def test_a_token_is_not_remembered_past_its_expiry(first_key: SigningKey) -> None:
    keys, clock = CountingKey(first_key), Clock()
    checker = verifier(keys, clock, cache_s=60, leeway_s=0)
    token = first_key.sign(exp=int(time.time()) + 10)
    await checker.verify(token)
    clock.now += 11  # past its exp: checked again (and refused once it really expired)
    await checker.verify(token)
    assert keys.asked == 2

    uncached = verifier(keys, clock, cache_s=0)
    await uncached.verify(token)
    await uncached.verify(token)
    assert keys.asked == 4


# -- the key set ---------------------------------------------------------------------------


async def test_a_stale_key_set_is_fetched_again_while_the_held_key_serves(
    issuer: JwksServer, first_key: SigningKey, second_key: SigningKey
) -> None:
    clock = Clock()
    keys = JwksKeys(issuer.url, cache_s=300, refresh_min_interval_s=30, timeout_s=5, clock=clock)
    try:
        assert await keys.key_for("key-1") is not None
        issuer.keys = [second_key]  # the issuer withdraws key-1 and publishes key-2
        clock.now += 301
        assert await keys.key_for("key-1") is not None  # held, while the set is fetched
        assert await keys.key_for("key-2") is not None  # waits for that fetch
        assert await keys.key_for("key-1") is None
        assert issuer.fetches == 2
    finally:
        await keys.close()


def test_only_usable_signing_keys_are_taken_from_a_set(first_key: SigningKey) -> None:
    entries = [
        first_key.jwk(),
        {"kty": "RSA", "kid": "broken", "n": 5, "e": "AQAB"},
        {"kty": "oct", "kid": "shared-secret", "k": "c2VjcmV0"},
        first_key.jwk() | {"kid": "for-encryption", "use": "enc"},
        "not an object",
    ]
    assert list(parse_jwks({"keys": entries})) == ["key-1"]
    with pytest.raises(ValueError, match="no keys array"):
        parse_jwks({"issuer": ISSUER})
