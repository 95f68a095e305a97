"""`auth.mode: jwt` against forged tokens: an algorithm that does not fit the key.

The server's key is RSA, EC (P-256, P-384) or Ed25519, from a PEM file or a key set. Tokens
are forged with keys of every other type, with `alg: none`, and with HS256 keyed by the
server's own public key PEM (the classic confusion of a public key for a shared secret).
Each is refused UNAUTHENTICATED `CREDENTIALS_INVALID` on a real server, with one INFO line
and no traceback; a genuine token of each algorithm the key fits is served.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import get_default_algorithms

from agio_grpc.config import JwtAuthConfig
from agio_grpc.service.auth_jwt import JwtVerifier, PemKey, key_algorithms
from agio_grpc.service.errors import ServiceError
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
from tests.service.test_auth_jwt import AUDIENCE, ISSUER, JwksServer, jwt_auth
from tests.sqlite import sqlite_at

PrivateKey = (
    rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey
)  # what a test key signs with


@dataclass(frozen=True)
class IssuerKey:
    """A key pair that signs with `algorithm`, published (PEM or JWK) under `kid`."""

    algorithm: str
    private: PrivateKey
    kid: str = "key-1"

    def pem(self) -> bytes:
        return self.private.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def jwk(self) -> dict[str, Any]:
        algorithm = get_default_algorithms()[self.algorithm]
        public: dict[str, Any] = json.loads(algorithm.to_jwk(self.private.public_key()))
        return public | {"kid": self.kid, "alg": self.algorithm, "use": "sig"}

    def sign(self, *, kid: str, algorithm: str | None = None, **claims: Any) -> str:
        return jwt.encode(
            claims_of(**claims), self.private, algorithm or self.algorithm, headers={"kid": kid}
        )


def claims_of(**claims: Any) -> dict[str, Any]:
    now = int(time.time())
    return {"iss": ISSUER, "aud": AUDIENCE, "sub": "user-1", "iat": now, "exp": now + 300} | claims


def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def hand_signed(header: dict[str, Any], secret: bytes | None) -> str:
    """A token made by hand, as a forger makes one: PyJWT refuses to sign HS256 with a PEM
    public key as the secret, or `none` with a key."""

    def part(value: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    signing_input = f"{part(header)}.{part(claims_of())}"
    signature = (
        b"" if secret is None else hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    )
    return f"{signing_input}.{base64.urlsafe_b64encode(signature).rstrip(b'=').decode()}"


SERVER_KEYS = {
    "rsa": IssuerKey("RS256", rsa_key()),
    "ec-p256": IssuerKey("ES256", ec.generate_private_key(ec.SECP256R1())),
    "ec-p384": IssuerKey("ES384", ec.generate_private_key(ec.SECP384R1())),
    "ed25519": IssuerKey("EdDSA", ed25519.Ed25519PrivateKey.generate()),
}
"""The issuer's key, by type."""

FORGERS = [
    IssuerKey("RS256", rsa_key()),
    IssuerKey("PS256", rsa_key()),
    IssuerKey("ES256", ec.generate_private_key(ec.SECP256R1())),
    IssuerKey("ES384", ec.generate_private_key(ec.SECP384R1())),
    IssuerKey("ES512", ec.generate_private_key(ec.SECP521R1())),
    IssuerKey("EdDSA", ed25519.Ed25519PrivateKey.generate()),
]
"""Keys the issuer never published, one per algorithm: a forger's."""

GENUINE_ALGORITHMS = {
    "rsa": ["RS256", "RS512", "PS256", "PS384"],
    "ec-p256": ["ES256"],
    "ec-p384": ["ES384"],
    "ed25519": ["EdDSA"],
}
"""What the issuer's key may sign with, and the server must accept by default."""


def forged_tokens(server_key: IssuerKey) -> dict[str, str]:
    """Every forgery of a token naming the server's key, by what it is."""
    forged = {f"{forger.algorithm}-forged": forger.sign(kid=server_key.kid) for forger in FORGERS}
    forged["HS256-keyed-by-the-public-pem"] = hand_signed(
        {"alg": "HS256", "typ": "JWT", "kid": server_key.kid}, server_key.pem()
    )
    forged["alg-none"] = hand_signed({"alg": "none", "typ": "JWT", "kid": server_key.kid}, None)
    forged["alg-missing"] = hand_signed({"typ": "JWT", "kid": server_key.kid}, b"x")
    forged["alg-not-a-string"] = hand_signed({"alg": ["ES256"], "kid": server_key.kid}, b"x")
    return forged


@pytest.fixture
async def key_set() -> AsyncIterator[JwksServer]:
    server = JwksServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.mark.parametrize("source", ["pem", "jwks"])
@pytest.mark.parametrize("key_type", list(SERVER_KEYS))
async def test_a_token_whose_algorithm_does_not_fit_the_key_is_refused_credentials_invalid(
    tmp_path: Path,
    fake_model: FakeModelServer,
    key_set: JwksServer,
    caplog: pytest.LogCaptureFixture,
    key_type: str,
    source: str,
) -> None:
    server_key = SERVER_KEYS[key_type]
    if source == "pem":
        (tmp_path / "issuer.pem").write_bytes(server_key.pem())
        auth = jwt_auth(public_key_file=str(tmp_path / "issuer.pem"))
    else:
        key_set.keys = [server_key]
        auth = jwt_auth(jwks_url=key_set.url)
    settings = auth_settings(sqlite_at(tmp_path / "agio.db"), fake_model.base_url, auth=auth)
    caplog.set_level(logging.INFO)
    async with serving(settings) as app:
        genuine = [server_key.sign(kid=server_key.kid, tenant="acme")]
        if source == "pem":  # a PEM key verifies every algorithm of its type
            genuine = [
                server_key.sign(kid=server_key.kid, algorithm=algorithm, tenant="acme")
                for algorithm in GENUINE_ALGORITHMS[key_type]
            ]
        for token in genuine:
            assert await whoami(app.address, bearer(token)) == "acme|user-1|jwt"

        for forgery, token in forged_tokens(server_key).items():
            error = await refusal(app.address, bearer(token))
            assert unauthenticated(error) == "CREDENTIALS_INVALID", forgery
            assert error.metadata == {"mode": "jwt"}
            assert (
                "signature algorithm not accepted" in error.message
                or "signature does not verify" in error.message
            ), (forgery, error.message)

    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert "Traceback" not in caplog.text
    assert "unhandled error" not in caplog.text


async def test_an_es256_token_against_an_rsa_key_names_the_algorithm_as_the_fault(
    tmp_path: Path, fake_model: FakeModelServer
) -> None:
    (tmp_path / "issuer.pem").write_bytes(SERVER_KEYS["rsa"].pem())
    settings = auth_settings(
        sqlite_at(tmp_path / "agio.db"),
        fake_model.base_url,
        auth=jwt_auth(public_key_file=str(tmp_path / "issuer.pem")),
    )
    forged = IssuerKey("ES256", ec.generate_private_key(ec.SECP256R1())).sign(kid="key-1")
    async with serving(settings) as app:
        error = await refusal(app.address, bearer(forged))
    assert unauthenticated(error) == "CREDENTIALS_INVALID"
    assert "signature algorithm not accepted for this key" in error.message


def test_each_key_type_fits_its_own_algorithms() -> None:
    assert key_algorithms(SERVER_KEYS["rsa"].private.public_key()) == {
        "RS256",
        "RS384",
        "RS512",
        "PS256",
        "PS384",
        "PS512",
    }
    assert key_algorithms(SERVER_KEYS["ec-p256"].private.public_key()) == {"ES256"}
    assert key_algorithms(SERVER_KEYS["ec-p384"].private.public_key()) == {"ES384"}
    assert key_algorithms(ec.generate_private_key(ec.SECP521R1()).public_key()) == {"ES512"}
    assert key_algorithms(SERVER_KEYS["ed25519"].private.public_key()) == {"EdDSA"}
    # secp256k1 has a JWS algorithm (ES256K) that the service does not accept.
    assert key_algorithms(ec.generate_private_key(ec.SECP256K1()).public_key()) == set()
    assert key_algorithms(jwt.PyJWK(SERVER_KEYS["rsa"].jwk() | {"alg": "PS256"})) == {"PS256"}


async def test_configured_algorithms_narrow_those_of_the_key(tmp_path: Path) -> None:
    server_key = SERVER_KEYS["rsa"]
    (tmp_path / "issuer.pem").write_bytes(server_key.pem())
    config = JwtAuthConfig(
        issuer=ISSUER,
        audience=AUDIENCE,
        public_key_file=tmp_path / "issuer.pem",
        algorithms=["RS256", "ES256"],
    )
    verifier = JwtVerifier(config, PemKey.read(tmp_path / "issuer.pem", config.algorithms))
    token = server_key.sign(kid="key-1", tenant="acme")
    assert (await verifier.verify(token)).tenant == "acme"
    with pytest.raises(ServiceError) as refused:
        await verifier.verify(server_key.sign(kid="key-1", algorithm="PS256"))
    assert refused.value.reason == "CREDENTIALS_INVALID"


@pytest.mark.parametrize(
    ("key_type", "algorithms"),
    [("ec-p256", ["RS256"]), ("rsa", ["ES256", "EdDSA"]), ("ec-p384", ["ES256"])],
)
def test_a_public_key_that_fits_no_configured_algorithm_refuses_to_start(
    tmp_path: Path, key_type: str, algorithms: list[str]
) -> None:
    pem = tmp_path / "issuer.pem"
    pem.write_bytes(SERVER_KEYS[key_type].pem())
    with pytest.raises(StartupError) as refused:
        PemKey.read(pem, algorithms)
    assert refused.value.setting == "AGIO_AUTH__JWT__ALGORITHMS"
    assert str(pem) in refused.value.what


def test_a_public_key_of_a_curve_without_an_accepted_algorithm_refuses_to_start(
    tmp_path: Path,
) -> None:
    pem = tmp_path / "issuer.pem"
    pem.write_bytes(
        ec.generate_private_key(ec.SECP256K1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(StartupError, match="fits: none"):
        PemKey.read(pem)
