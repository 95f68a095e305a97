"""`auth.mode: jwt`: bearer JSON Web Tokens from an identity provider, verified by PyJWT.

A token's signature is checked with the provider's public key: from its JSON Web Key Set
(`auth.jwt.jwks_url`, the key named by the token's `kid`) or from one PEM file
(`auth.jwt.public_key_file`, read at start). Then `iss` and `aud` must be the configured
ones, `exp` must be ahead (all three required), `nbf` and `iat` behind, each within
`leeway_s`. Only public-key algorithms are accepted (config.JWT_ALGORITHMS), and of those
only the ones the key fits (`key_algorithms`: an RSA key verifies RS* and PS*, an EC key the
ES* of its curve, a JWK the algorithm it was made for), narrowed by `auth.jwt.algorithms`
when set. A token naming any other algorithm (`none`, HS256 with the public key as its
secret, ES256 against an RSA key) is refused before PyJWT sees it: PyJWT raises some of
those refusals outside `PyJWTError`. The tenant is the `tenant_claim` claim, else `sub`.

The key set is fetched with aiohttp (never a blocking fetch on the event loop), kept
`jwks_cache_s` (then fetched again in the background while the keys held serve), and fetched
again, at most every `jwks_refresh_min_interval_s`, when a token
names a key id it does not hold (the provider rotated its keys). When it cannot be fetched,
the keys held are used on; with none held, a call is refused UNAVAILABLE
`AUTHENTICATION_UNAVAILABLE` (the token may be good).

A token verified is remembered `auth.jwt.cache_s` (default 60 s, never past its `exp`), by
its exact text: a client sending the same token with every call pays for the signature
check once.

A refusal says what was wrong (expired, wrong audience...) in words of its own, never with
the library's message, which may quote the token.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import aiohttp
import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from agio_grpc.config import JWT_ALGORITHMS, AuthMode, JwtAuthConfig
from agio_grpc.domain import is_tenant_name
from agio_grpc.service.errors import (
    CREDENTIALS_EXPIRED,
    CREDENTIALS_INVALID,
    ServiceError,
    authentication_unavailable,
    unauthenticated,
)
from agio_grpc.service.identity import Caller
from agio_grpc.service.startup import StartupError, one_line

log = logging.getLogger(__name__)

MAX_JWKS_BYTES = 1024 * 1024
MAX_REMEMBERED_TOKENS = 10_000
"""Verified tokens kept at most (the oldest go first)."""
REQUIRED_CLAIMS = ["exp", "iss", "aud"]
RSA_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
EC_ALGORITHMS = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}
"""The algorithm of each curve (RFC 7518 3.4: ES256 is P-256 only, and so on)."""

# What was wrong, in our words: PyJWT's messages may quote the token's contents.
_REFUSALS: list[tuple[type[jwt.PyJWTError], str]] = [
    (jwt.InvalidSignatureError, "the signature does not verify"),
    (jwt.DecodeError, "not a well-formed JWT"),
    (jwt.InvalidAudienceError, "wrong audience"),
    (jwt.InvalidIssuerError, "wrong issuer"),
    (jwt.ImmatureSignatureError, "not valid yet (nbf or iat ahead)"),
    (jwt.InvalidIssuedAtError, "iat is not a time"),
    (jwt.InvalidAlgorithmError, "signature algorithm not accepted"),
    (jwt.InvalidKeyError, "signature algorithm not accepted"),
]
ALGORITHM_REFUSED = "signature algorithm not accepted for this key"


def key_algorithms(key: Any) -> frozenset[str]:
    """The public-key algorithms that verify with `key`, by its type; none for a key of
    a type no accepted algorithm fits (DSA, an EC curve without a JWS algorithm)."""
    if isinstance(key, jwt.PyJWK):
        return frozenset({key.algorithm_name}) & JWT_ALGORITHMS
    if isinstance(key, rsa.RSAPublicKey):
        return RSA_ALGORITHMS
    if isinstance(key, ec.EllipticCurvePublicKey):
        algorithm = EC_ALGORITHMS.get(key.curve.name)
        return frozenset({algorithm} if algorithm else ())
    if isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        return frozenset({"EdDSA"})
    return frozenset()


def accepted_algorithms(key: Any, configured: list[str] | None) -> frozenset[str]:
    """What a token verified with `key` may be signed with: the key's algorithms, of those
    `auth.jwt.algorithms` names when it is set."""
    fitting = key_algorithms(key)
    return fitting if configured is None else fitting & frozenset(configured)


class SigningKeys(Protocol):
    """Where the keys that verify tokens come from."""

    async def key_for(self, kid: str | None) -> Any | None:
        """The key for a token naming `kid` (None when it names none); None when no key
        is known for it. Raises ServiceError when keys cannot be had now."""
        ...

    async def close(self) -> None: ...


class JwtVerifier:
    """Verifies bearer JWTs with `SigningKeys`; remembers the tokens it verified for
    `cache_s`, never past their expiry."""

    mode: AuthMode = "jwt"

    def __init__(
        self,
        config: JwtAuthConfig,
        keys: SigningKeys,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._keys = keys
        self._options: jwt.types.Options = {"require": REQUIRED_CLAIMS}
        self._clock = clock
        self._wall_clock = wall_clock
        self._verified: dict[str, tuple[Caller, float]] = {}

    async def verify(self, token: str) -> Caller:
        remembered = self._verified.get(token)
        if remembered is not None and self._clock() < remembered[1]:
            return remembered[0]
        caller, expires = await self._check(token)
        self._remember(token, caller, expires)
        return caller

    def _remember(self, token: str, caller: Caller, expires: float) -> None:
        """Keep a verified token until `cache_s` from now or its `exp`, whichever is first."""
        lifetime = min(self._config.cache_s, expires + self._config.leeway_s - self._wall_clock())
        if lifetime <= 0:
            return
        self._verified.pop(token, None)  # checked again: it goes to the end, as the newest
        if len(self._verified) >= MAX_REMEMBERED_TOKENS:
            del self._verified[next(iter(self._verified))]  # the oldest
        self._verified[token] = (caller, self._clock() + lifetime)

    async def _check(self, token: str) -> tuple[Caller, float]:
        """The caller a token authenticates, and its `exp` (wall clock)."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise self._invalid("not a well-formed JWT") from None
        kid = header.get("kid")
        key = await self._keys.key_for(kid if isinstance(kid, str) else None)
        if key is None:
            raise self._invalid("signed with a key the issuer does not publish (kid)")
        algorithm = header.get("alg")
        if not isinstance(algorithm, str) or algorithm not in accepted_algorithms(
            key, self._config.algorithms
        ):
            raise self._invalid(ALGORITHM_REFUSED)
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[algorithm],
                audience=self._config.audience,
                issuer=self._config.issuer,
                leeway=self._config.leeway_s,
                options=self._options,
            )
        except jwt.ExpiredSignatureError:
            raise unauthenticated(CREDENTIALS_EXPIRED, self.mode) from None
        except jwt.MissingRequiredClaimError as error:
            raise self._invalid(f"no {error.claim} claim") from None
        except jwt.PyJWTError as error:
            raise self._invalid(_refusal(error)) from None
        return self._caller(claims), float(claims["exp"])

    async def close(self) -> None:
        await self._keys.close()

    def _caller(self, claims: dict[str, Any]) -> Caller:
        claim = self._config.tenant_claim
        subject = claims.get("sub")
        tenant = claims.get(claim, subject)
        if not isinstance(tenant, str) or not is_tenant_name(tenant):
            raise self._invalid(f"no tenant: neither a {claim} nor a sub claim names one")
        return Caller(tenant, subject if isinstance(subject, str) else "", self.mode)

    def _invalid(self, detail: str) -> ServiceError:
        return unauthenticated(CREDENTIALS_INVALID, self.mode, detail)


def _refusal(error: jwt.PyJWTError) -> str:
    for kind, detail in _REFUSALS:
        if isinstance(error, kind):
            return detail
    return "not a valid token"


def signing_keys(config: JwtAuthConfig) -> SigningKeys:
    """The key source `config` names (the PEM file is read now: StartupError if it cannot)."""
    if config.public_key_file is not None:
        return PemKey.read(config.public_key_file, config.algorithms)
    assert config.jwks_url is not None  # the configuration requires one of the two
    return JwksKeys(
        config.jwks_url,
        cache_s=config.jwks_cache_s,
        refresh_min_interval_s=config.jwks_refresh_min_interval_s,
        timeout_s=config.jwks_timeout_s,
    )


class PemKey:
    """One public key, from a PEM file, for every token whatever its `kid`."""

    def __init__(self, key: Any) -> None:
        self._key = key

    @classmethod
    def read(cls, path: Path, algorithms: list[str] | None = None) -> PemKey:
        """The key of a PEM file, which must fit one of `algorithms` (None: any accepted
        one); StartupError when it cannot be read or fits none."""
        try:
            key = load_pem_public_key(path.read_bytes())
        except (OSError, ValueError, TypeError) as error:
            raise StartupError(
                f"cannot read the JWT public key {path}: {one_line(error)}",
                "AGIO_AUTH__JWT__PUBLIC_KEY_FILE",
                "name a readable PEM file holding the issuer's public key "
                "(-----BEGIN PUBLIC KEY-----), or use auth.jwt.jwks_url",
            ) from error
        if not accepted_algorithms(key, algorithms):
            fitting = ", ".join(sorted(key_algorithms(key))) or "none"
            raise StartupError(
                f"the JWT public key {path} ({type(key).__name__}) verifies none of the "
                f"algorithms accepted (it fits: {fitting})",
                "AGIO_AUTH__JWT__ALGORITHMS",
                "leave auth.jwt.algorithms unset (the key's own are accepted) or name the "
                "key's; the key must be RSA, EC on P-256, P-384 or P-521, Ed25519 or Ed448",
            )
        return cls(key)

    async def key_for(self, kid: str | None) -> Any | None:
        return self._key

    async def close(self) -> None:
        return None


class JwksKeys:
    """The keys of a JSON Web Key Set URL, by `kid`, fetched when needed."""

    def __init__(
        self,
        url: str,
        *,
        cache_s: float,
        refresh_min_interval_s: float,
        timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._url = url
        self._cache_s = cache_s
        self._refresh_min_interval_s = refresh_min_interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._clock = clock
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched_at = -math.inf
        self._tried_at = -math.inf
        self._fetching: asyncio.Task[bool] | None = None
        self._session: aiohttp.ClientSession | None = None

    async def key_for(self, kid: str | None) -> jwt.PyJWK | None:
        now = self._clock()
        fetched = True
        if now - self._fetched_at >= self._cache_s and self._may_fetch(now):
            if self._find(kid) is None:
                fetched = await self._fetch_once()
            else:  # the key held serves this call while the set is fetched again
                self._start_fetch()
        key = self._find(kid)
        if key is None and self._may_fetch(now):
            fetched = await self._fetch_once()  # rotated: a key published since
            key = self._find(kid)
        if key is None and (not fetched or not self._keys):
            raise authentication_unavailable("jwt")
        return key

    async def close(self) -> None:
        if self._fetching is not None:
            await asyncio.gather(self._fetching, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def _may_fetch(self, now: float) -> bool:
        return self._fetching is not None or now - self._tried_at >= self._refresh_min_interval_s

    def _find(self, kid: str | None) -> jwt.PyJWK | None:
        if kid is None:  # a token naming no key: only a set of one says which
            return next(iter(self._keys.values())) if len(self._keys) == 1 else None
        return self._keys.get(kid)

    async def _fetch_once(self) -> bool:
        """Fetch the set, or wait for the fetch under way; whether it was fetched."""
        return await asyncio.shield(self._start_fetch())

    def _start_fetch(self) -> asyncio.Task[bool]:
        """The fetch under way, started now if there is none."""
        if self._fetching is None:
            self._tried_at = self._clock()
            self._fetching = asyncio.create_task(self._fetch())
            self._fetching.add_done_callback(self._fetch_done)
        return self._fetching

    def _fetch_done(self, done: asyncio.Task[bool]) -> None:
        self._fetching = None

    async def _fetch(self) -> bool:
        try:
            keys = parse_jwks(await self._get())
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            log.warning("cannot fetch the JWKS %s: %s", self._url, one_line(error))
            return False
        self._keys = keys
        self._fetched_at = self._clock()
        return True

    async def _get(self) -> Any:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        async with self._session.get(self._url, headers={"Accept": "application/json"}) as reply:
            reply.raise_for_status()
            body = await reply.content.read(MAX_JWKS_BYTES + 1)
        if len(body) > MAX_JWKS_BYTES:
            raise ValueError(f"the key set is larger than {MAX_JWKS_BYTES} bytes")
        return json.loads(body)


def parse_jwks(document: Any) -> dict[str, jwt.PyJWK]:
    """The signing keys of a JWKS document, by `kid`: keys for encryption, symmetric keys
    and keys PyJWT cannot use are left out. ValueError when there is no `keys` array."""
    entries = document.get("keys") if isinstance(document, dict) else None
    if not isinstance(entries, list):
        raise ValueError("not a JSON Web Key Set (no keys array)")
    keys: dict[str, jwt.PyJWK] = {}
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
            continue
        if entry.get("kty") == "oct":  # a shared secret has no place in a public key set
            continue
        try:
            key = jwt.PyJWK(entry)
        except Exception as error:  # a malformed key leaves out that key, not the set
            log.info("JWKS: key %r left out: %s", entry.get("kid"), type(error).__name__)
            continue
        kid = entry.get("kid")
        keys[kid if isinstance(kid, str) else ""] = key
    return keys
