"""Authentication at the edge: who is calling, decided once per call before any handler runs.

`AuthInterceptor` wraps every `agio.v1` handler. It asks the `Authenticator` of the
configured mode (`auth.mode`, `AGIO_AUTH`) for the call's `Caller` and makes it current for
the handler (`identity.calling_as`), whose tasks inherit it; a call that cannot be
authenticated is refused UNAUTHENTICATED with an ErrorInfo reason (`errors.unauthenticated`:
CREDENTIALS_MISSING, CREDENTIALS_INVALID, CREDENTIALS_EXPIRED, KEY_REVOKED) before its
handler or its request is looked at. Health checking and reflection are not `agio.v1`: they
pass untouched, and answer without a credential.

| mode | credential | tenant |
|---|---|---|
| `none` | none (no interceptor is installed) | `default` |
| `api_key` | `authorization: Bearer agio_<id>_<secret>` (auth_api_key.py) | the key's |
| `jwt` | `authorization: Bearer <JWT>` (auth_jwt.py) | a claim (`tenant`, else `sub`) |
| `mtls` | the client certificate the TLS transport verified (auth_mtls.py) | its CN or a SAN URI |

The interceptor goes after tracing (the refusal's status is on the call's span) and before
the error interceptor, so a caller is refused before its request is checked: it learns
nothing of what the service would accept. It maps its own refusals with `errors.to_status`,
the one place statuses are made.

Never logs a credential, or any part of one: a refusal is logged with its method, reason,
what was wrong and the peer's address only.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, Protocol

import grpc

from agio_grpc.config import AuthMode, Settings
from agio_grpc.handlers import AgioMethodInterceptor, Behavior, rewrap_handler
from agio_grpc.service.auth_api_key import ApiKeyVerifier
from agio_grpc.service.auth_jwt import JwtVerifier, signing_keys
from agio_grpc.service.auth_mtls import CertificateAuthenticator
from agio_grpc.service.errors import (
    CREDENTIALS_INVALID,
    CREDENTIALS_MISSING,
    as_service_error,
    to_status,
    unauthenticated,
)
from agio_grpc.service.identity import Caller, calling_as
from agio_grpc.service.interceptors import abort_call
from agio_grpc.service.startup import StartupError
from agio_grpc.store.keys import KeyStore

log = logging.getLogger(__name__)

AUTHORIZATION = "authorization"
BEARER = "bearer"
CHOOSE_A_MODE = (
    "set AGIO_AUTH to api_key (keys made with `agio-grpc keys create`), jwt or mtls; "
    "or to none to serve every caller, unauthenticated, in one tenant"
)


class Authenticator(Protocol):
    """Establishes who is making a call."""

    mode: AuthMode

    async def authenticate(self, context: grpc.aio.ServicerContext) -> Caller:
        """The call's caller; raises ServiceError (UNAUTHENTICATED, or UNAVAILABLE when the
        credential cannot be checked now)."""
        ...

    async def close(self) -> None:
        """Release what it holds (connections, pending writes)."""
        ...


class TokenVerifier(Protocol):
    """Checks a bearer credential (an API key, a JWT)."""

    mode: AuthMode

    async def verify(self, token: str) -> Caller:
        """The caller `token` authenticates; raises ServiceError as `authenticate` does."""
        ...

    async def close(self) -> None: ...


def bearer_token(metadata: Sequence[tuple[str, str | bytes]] | None, mode: AuthMode) -> str:
    """The credential of the call's `authorization: Bearer <credential>` metadata."""
    values = [value for key, value in metadata or () if key == AUTHORIZATION]
    if not values:
        raise unauthenticated(CREDENTIALS_MISSING, mode)
    if len(values) > 1:
        raise unauthenticated(CREDENTIALS_INVALID, mode, "more than one authorization entry")
    value = values[0]
    scheme, _, token = value.partition(" ") if isinstance(value, str) else ("", "", "")
    token = token.strip()
    if scheme.lower() != BEARER or not token:
        raise unauthenticated(
            CREDENTIALS_INVALID, mode, "authorization must be `Bearer <credential>`"
        )
    return token


class BearerAuthenticator:
    """`api_key` and `jwt`: the credential is the call's bearer token."""

    def __init__(self, verifier: TokenVerifier) -> None:
        self._verifier = verifier
        self.mode: AuthMode = verifier.mode

    async def authenticate(self, context: grpc.aio.ServicerContext) -> Caller:
        return await self._verifier.verify(bearer_token(context.invocation_metadata(), self.mode))

    async def close(self) -> None:
        await self._verifier.close()


class AuthInterceptor(AgioMethodInterceptor):
    """Authenticates every `agio.v1` call and runs its handler as its caller (a method of a
    kind the service does not serve yet is authenticated all the same)."""

    def __init__(self, authenticator: Authenticator) -> None:
        self._authenticator = authenticator

    def rewrap(
        self, handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler:
        return rewrap_handler(handler, self._authenticated(details.method))

    def _authenticated(self, method: str) -> Callable[[Behavior], Behavior]:
        def wrap(behavior: Behavior) -> Behavior:
            async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
                try:
                    caller = await self._authenticator.authenticate(context)
                except (asyncio.CancelledError, grpc.aio.AbortError):
                    raise
                except Exception as error:
                    await _refuse(method, context, error)
                with calling_as(caller):
                    return await behavior(request, context)

            return handler

        return wrap


async def _refuse(method: str, context: grpc.aio.ServicerContext, error: Exception) -> NoReturn:
    """End the call with the status of `error` (logged without any of the credential)."""
    refusal = as_service_error(error)
    log.info(
        "refused %s from %s: %s %s (%s)",
        method,
        context.peer(),
        refusal.code.name,
        refusal.reason,
        refusal.message,
    )
    await abort_call(method, context, to_status(refusal))


# -- start-up ------------------------------------------------------------------------------


def is_loopback(listen_address: str) -> bool:
    """Whether a `host:port` listen address is reachable from this machine only."""
    host = listen_address.rpartition(":")[0].removeprefix("[").removesuffix("]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name, or "" (every interface)


def choose_auth_mode(settings: Settings) -> AuthMode:
    """The mode to serve with. Unset: `none` when every listener (gRPC, and HTTP when set)
    is on a loopback address; elsewhere the server must not start open to the network by
    default, so this raises StartupError."""
    mode = settings.auth.mode
    address = settings.listen_address
    if mode is None:
        exposed = [
            listener
            for listener in (settings.listen_address, settings.http_address)
            if listener and not is_loopback(listener)
        ]
        if not exposed:
            return "none"
        address = exposed[0]
        raise StartupError(
            f"no authentication chosen for {address}, which other machines can reach",
            "AGIO_AUTH",
            CHOOSE_A_MODE,
        )
    if mode == "none":
        log.warning(
            "authentication is off (AGIO_AUTH=none): every caller of %s is served, "
            "in the default tenant",
            " and of the HTTP listener ".join(
                listener
                for listener in (settings.listen_address, settings.http_address)
                if listener
            ),
        )
    return mode


def reflection_enabled(settings: Settings, mode: AuthMode) -> bool:
    """`server.reflection`; unset: on only when no one is authenticated (`none`)."""
    chosen = settings.server.reflection
    return mode == "none" if chosen is None else chosen


def build_authenticator(settings: Settings, mode: AuthMode, keys: KeyStore) -> Authenticator | None:
    """The authenticator of `mode` (None for `none`: nothing to check, everyone is the
    default tenant). Reads the JWT public key file now: StartupError when it cannot."""
    config = settings.auth
    if mode == "api_key":
        return BearerAuthenticator(ApiKeyVerifier(keys, config.api_key.cache_s))
    if mode == "jwt":
        return BearerAuthenticator(JwtVerifier(config.jwt, signing_keys(config.jwt)))
    if mode == "mtls":
        return CertificateAuthenticator(config.mtls)
    return None
