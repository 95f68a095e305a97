"""How the client reaches servers: addresses and targets (several servers round robin),
TLS and mutual TLS from PEM files, the gRPC channel."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc


class TlsFileError(ValueError):
    """A TLS file of the client that cannot be used (unreadable, or a certificate without
    its key)."""


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """How the client reaches the server over TLS."""

    ca_file: str | Path | None = None
    """PEM certificates of the CAs that signed the server's certificate; None: gRPC's
    default roots (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, else the ones grpcio ships)."""
    cert_file: str | Path | None = None
    """The client's PEM certificate chain, for a server that asks for one (mutual TLS)."""
    key_file: str | Path | None = None
    """The PEM private key of `cert_file`."""

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Read the files; raises TlsFileError."""
        if (self.cert_file is None) != (self.key_file is None):
            raise TlsFileError("a client certificate goes with its key: give both or neither")
        return grpc.ssl_channel_credentials(
            root_certificates=_read_tls_file(self.ca_file, "CA"),
            private_key=_read_tls_file(self.key_file, "key"),
            certificate_chain=_read_tls_file(self.cert_file, "certificate"),
        )


def _read_tls_file(path: str | Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise TlsFileError(f"cannot read the {what} file {path}: {error.strerror}") from None


class AddressError(ValueError):
    """Server addresses that make no gRPC target."""


ROUND_ROBIN = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})
"""The channel's service config: calls spread over every address the target names (or a
DNS name resolves to), one after the other, skipping those not connected."""

_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:", "xds:")
"""gRPC target schemes, whose targets are passed to gRPC as they are."""


def channel_target(address: str | Sequence[str]) -> str:
    """The gRPC target for one address (`host:port`, or a target with its scheme such as
    `dns:///agio.internal:50051`), or for several `host:port` given as a list or as one
    comma-separated string (`AGIO_ADDRESS`): IP addresses of one family, which become one
    `ipv4:` or `ipv6:` target (several host names: use one DNS name that resolves to all)."""
    if isinstance(address, str):
        if address.startswith(_SCHEMES):
            return address
        address = address.split(",")
    parts = [part.strip() for part in address if part.strip()]
    if not parts:
        raise AddressError("no server address given")
    if len(parts) == 1:
        return parts[0]
    families = {_ip_family(part) for part in parts}
    if len(families) != 1 or None in families:
        raise AddressError(
            f"several addresses must be IP addresses of one family ({', '.join(parts)}); "
            "for host names, give one dns:///NAME:PORT that resolves to them all"
        )
    return f"{families.pop()}:{','.join(parts)}"


def _ip_family(address: str) -> str | None:
    """`ipv4` or `ipv6` for `IP:PORT` (`[IPv6]:PORT`), else None."""
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return None
    try:
        ip = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return None
    if ip.version == 6 and not host.startswith("["):
        return None
    return f"ipv{ip.version}"


def open_channel(target: str | Sequence[str], tls: TlsConfig | bool = False) -> grpc.aio.Channel:
    """A channel to `target` (see `channel_target`) balancing calls round robin over its
    addresses: plaintext, or TLS (`True`: with gRPC's default roots). Each channel has
    connections of its own: two channels to one address are two connections."""
    options: list[tuple[str, str | int]] = [
        ("grpc.service_config", ROUND_ROBIN),
        # gRPC shares one connection per address among every channel of the process
        # (its global subchannel pool): several clients of `serve --workers N` would all
        # land on the worker that took the first connection.
        ("grpc.use_local_subchannel_pool", 1),
    ]
    if tls is False:
        return grpc.aio.insecure_channel(channel_target(target), options)
    config = TlsConfig() if tls is True else tls
    return grpc.aio.secure_channel(channel_target(target), config.channel_credentials(), options)
