"""Errors of the client: a call's gRPC status decoded into `AgioError` (its `google.rpc.ErrorInfo`
reason, field violations), and a failed TLS handshake told apart from other failures."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import grpc
from google.rpc import error_details_pb2, status_pb2

_STATUS_DETAILS_KEY = "grpc-status-details-bin"


class TlsFailure(enum.Enum):
    """Why the client could not connect, when it failed in or around the TLS handshake
    (read from gRPC's message: no call reached the server)."""

    SERVER_WANTS_TLS = "the server may speak TLS"
    """A plaintext client whose connection the server closed at once."""
    UNTRUSTED_CERTIFICATE = "the server's certificate is not signed by a CA the client trusts"
    SERVER_WITHOUT_TLS = "the server speaks plaintext"
    """A TLS client that got no TLS answer."""
    HANDSHAKE_REFUSED = "the server refused the TLS handshake"
    """A TLS client whose connection the server closed in the handshake: most often a mutual
    TLS server and a client without a certificate its CA signed."""


TLS_HINTS = {
    TlsFailure.SERVER_WANTS_TLS: "connect with tls=TlsConfig(ca_file=...) naming the CA that "
    "signed its certificate (tls=True for a public CA)",
    TlsFailure.UNTRUSTED_CERTIFICATE: "name the CA that signed it in TlsConfig(ca_file=...)",
    TlsFailure.SERVER_WITHOUT_TLS: "connect without tls",
    TlsFailure.HANDSHAKE_REFUSED: "with mutual TLS it wants a client certificate a CA it "
    "accepts signed: TlsConfig(cert_file=..., key_file=...), and ca_file for the server's CA",
}
"""What to change in the client for each TlsFailure (the CLI says it with its options)."""


@dataclass(slots=True)
class AgioError(Exception):
    """A call that failed, with its status and the server's stable `reason`."""

    code: grpc.StatusCode
    message: str
    reason: str = ""
    domain: str = ""
    """The ErrorInfo domain (`agio-grpc` for errors raised by the service)."""
    metadata: dict[str, str] = field(default_factory=dict)
    field_violations: list[tuple[str, str]] = field(default_factory=list)
    tls_failure: TlsFailure | None = None
    """Set when the connection failed in the TLS handshake (or, plaintext, looks as if the
    server wanted one): `__str__` then says what to change."""

    def __str__(self) -> str:
        reason = f" [{self.reason}]" if self.reason else ""
        text = f"{self.code.name}{reason}: {self.message}"
        if self.tls_failure is not None:
            text += f" ({self.tls_failure.value}: {TLS_HINTS[self.tls_failure]})"
        return text


def tls_failure(code: grpc.StatusCode, message: str, tls: bool | None) -> TlsFailure | None:
    """The TlsFailure a failed connection's status says, if any. `tls`: whether the channel
    speaks TLS (None: unknown, a channel the caller made)."""
    # Only failures to connect (gRPC's round robin and pick-first say so each its way): a
    # connection that broke later says nothing about TLS.
    connecting = "all backends failing" in message or "failed to connect to all" in message
    if code is not grpc.StatusCode.UNAVAILABLE or not connecting:
        return None
    if "CERTIFICATE_VERIFY_FAILED" in message:
        return TlsFailure.UNTRUSTED_CERTIFICATE
    if "WRONG_VERSION_NUMBER" in message:
        return TlsFailure.SERVER_WITHOUT_TLS
    if "Socket closed" in message or "handshake failed" in message.lower():
        if tls is None:
            return None
        return TlsFailure.HANDSHAKE_REFUSED if tls else TlsFailure.SERVER_WANTS_TLS
    return None


def decode_error(error: grpc.aio.AioRpcError, *, tls: bool | None = None) -> AgioError:
    """The AgioError for a failed call, with ErrorInfo and BadRequest details when sent, and
    the TlsFailure of a connection that failed in its handshake (`tls`: whether the channel
    speaks TLS; None: unknown)."""
    message = error.details() or ""
    decoded = AgioError(
        code=error.code(), message=message, tls_failure=tls_failure(error.code(), message, tls)
    )
    for key, value in error.trailing_metadata() or ():
        if key != _STATUS_DETAILS_KEY or not isinstance(value, bytes):
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                decoded.reason = info.reason
                decoded.domain = info.domain
                decoded.metadata = dict(info.metadata)
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                decoded.field_violations = [(v.field, v.description) for v in bad.field_violations]
    return decoded
