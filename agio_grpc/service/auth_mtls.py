"""`auth.mode: mtls`: the tenant is named by the client certificate of the call's connection.

The TLS transport verifies the certificate against the client CA during the handshake
(it must require one); what it verified reaches a handler as the call's auth context, whose
keys (grpc 1.85) include `x509_common_name`, `x509_subject`, `x509_subject_alternative_name`
(every SAN, whatever its type) and `peer_uri` (the URI SANs only), each a list of bytes. A
connection without a certificate has none of them: CREDENTIALS_MISSING.

`auth.mtls.tenant_from`: `cn`, the subject's common name; or `san_uri`, the first URI SAN
that starts with `san_uri_prefix`, less the prefix (`spiffe://example.org/tenant/acme` with
the prefix `spiffe://example.org/tenant/` is the tenant `acme`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import grpc

from agio_grpc.config import AuthMode, MtlsAuthConfig
from agio_grpc.domain import is_tenant_name
from agio_grpc.service.errors import CREDENTIALS_INVALID, CREDENTIALS_MISSING, unauthenticated
from agio_grpc.service.identity import Caller

AuthContext = Mapping[str, Sequence[bytes]]

COMMON_NAME = "x509_common_name"
SUBJECT = "x509_subject"
SUBJECT_ALTERNATIVE_NAMES = "x509_subject_alternative_name"
URI_NAMES = "peer_uri"

MODE: AuthMode = "mtls"


def caller_from_certificate(auth_context: AuthContext, config: MtlsAuthConfig) -> Caller:
    """The caller a verified client certificate names; raises ServiceError when there is no
    certificate, or it names no tenant."""
    if not any(auth_context.get(key) for key in (COMMON_NAME, SUBJECT, SUBJECT_ALTERNATIVE_NAMES)):
        raise unauthenticated(CREDENTIALS_MISSING, MODE, "no client certificate")
    if config.tenant_from == "cn":
        names = _texts(auth_context.get(COMMON_NAME, ()))
        if len(names) != 1 or not is_tenant_name(names[0]):
            raise unauthenticated(
                CREDENTIALS_INVALID, MODE, "the certificate's common name names no tenant"
            )
        return Caller(names[0], names[0], MODE)
    for uri in _uri_names(auth_context):
        if uri.startswith(config.san_uri_prefix):
            tenant = uri.removeprefix(config.san_uri_prefix)
            if is_tenant_name(tenant):
                return Caller(tenant, uri, MODE)
    raise unauthenticated(
        CREDENTIALS_INVALID,
        MODE,
        f"no URI SAN of the certificate starts with {config.san_uri_prefix!r} and names a tenant",
    )


def _uri_names(auth_context: AuthContext) -> list[str]:
    """The certificate's URI SANs (from the SAN list when grpc gives no `peer_uri`)."""
    if URI_NAMES in auth_context:
        return _texts(auth_context[URI_NAMES])
    return [
        name for name in _texts(auth_context.get(SUBJECT_ALTERNATIVE_NAMES, ())) if "://" in name
    ]


def _texts(values: Sequence[bytes]) -> list[str]:
    """The values that are UTF-8 text (a name that is not cannot name a tenant)."""
    texts = []
    for value in values:
        try:
            texts.append(value.decode())
        except UnicodeDecodeError:
            continue
    return texts


class CertificateAuthenticator:
    """Authenticates each call by its connection's client certificate."""

    mode: AuthMode = MODE

    def __init__(self, config: MtlsAuthConfig) -> None:
        self._config = config

    async def authenticate(self, context: grpc.aio.ServicerContext) -> Caller:
        return caller_from_certificate(context.auth_context(), self._config)

    async def close(self) -> None:
        return None
