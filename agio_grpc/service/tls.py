"""The server's transport security: TLS, or mutual TLS, from PEM files re-read on SIGHUP.

`ServerCertificates.load(settings)` reads AGIO_TLS_CERT_FILE, AGIO_TLS_KEY_FILE and
AGIO_TLS_CLIENT_CA_FILE and checks them: each readable, each PEM that parses, the key the
certificate's. A file that fails is a `TlsFileError`, a StartupError naming its setting.

`credentials()` are gRPC's dynamic SSL credentials: gRPC asks `_take_next` before every new
handshake whether to serve another certificate. `reload()` (on SIGHUP) reads the files again
and, when they pass the same checks, has the next handshake take them; connections already
open keep the certificate they were made with, and so do their streams. Files that fail
the checks leave the current ones in place, with one ERROR line in the log.
"""

from __future__ import annotations

import datetime
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes

from agio_grpc.config import Settings
from agio_grpc.service.startup import StartupError, one_line

log = logging.getLogger(__name__)

CERT_SETTING = "AGIO_TLS_CERT_FILE"
KEY_SETTING = "AGIO_TLS_KEY_FILE"
CLIENT_CA_SETTING = "AGIO_TLS_CLIENT_CA_FILE"


class TlsFileError(StartupError):
    """A TLS file the server cannot use; at start-up it stops the server, on a reload the
    current files stay."""


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Where the server's TLS material lives."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None
    """Set: clients must present a certificate one of these CAs signed."""

    @classmethod
    def from_settings(cls, settings: Settings) -> TlsFiles | None:
        """The configured files, or None for plaintext."""
        if settings.tls_cert_file is None or settings.tls_key_file is None:
            return None
        return cls(settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file)


@dataclass(frozen=True, slots=True)
class CertificateSet:
    """What one reading of the files gave, checked and in the PEM form gRPC takes."""

    certificate: x509.Certificate
    """The server's own certificate (the first of the chain)."""
    chain_pem: bytes
    key_pem: bytes
    client_ca_pem: bytes | None

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(self.key_pem, self.chain_pem)], root_certificates=self.client_ca_pem
        )

    def describe(self) -> str:
        """The certificate in a log line: subject, serial and expiry."""
        expiry = self.certificate.not_valid_after_utc.strftime("%Y-%m-%d %H:%M UTC")
        return (
            f"{self.certificate.subject.rfc4514_string() or '(no subject)'}, "
            f"serial {self.certificate.serial_number:x}, valid until {expiry}"
        )


def read_certificates(files: TlsFiles) -> CertificateSet:
    """Read and check the files; raise TlsFileError naming the first that fails."""
    chain = _certificates(files.cert_file, CERT_SETTING, "the server's certificate chain")
    key = _private_key(files.key_file)
    if _public_der(chain[0]) != _public_key_der(key):
        raise TlsFileError(
            f"the key in {files.key_file} is not the one of the certificate in {files.cert_file}",
            KEY_SETTING,
            f"give the private key of the certificate in {CERT_SETTING} "
            "(or the certificate of this key)",
        )
    client_ca_pem = None
    if files.client_ca_file is not None:
        client_cas = _certificates(
            files.client_ca_file, CLIENT_CA_SETTING, "the certificates of the clients' CAs"
        )
        client_ca_pem = _pem(client_cas)
    return CertificateSet(
        certificate=chain[0],
        chain_pem=_pem(chain),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
        client_ca_pem=client_ca_pem,
    )


def _read(path: Path, setting: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise TlsFileError(
            f"cannot read {path}: {error.strerror or one_line(error)}",
            setting,
            "give the path of a file the server's user may read",
        ) from error


def _certificates(path: Path, setting: str, holds: str) -> list[x509.Certificate]:
    data = _read(path, setting)
    try:
        return x509.load_pem_x509_certificates(data)
    except ValueError as error:
        raise TlsFileError(
            f"{path} holds no PEM certificate",
            setting,
            f"give a PEM file (-----BEGIN CERTIFICATE-----) with {holds}",
        ) from error


def _private_key(path: Path) -> PrivateKeyTypes:
    data = _read(path, KEY_SETTING)
    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError as error:  # encrypted
        raise TlsFileError(
            f"the key in {path} is encrypted",
            KEY_SETTING,
            "give the key unencrypted (openssl pkey -in KEY -out PLAIN.key), readable by the "
            "server's user only",
        ) from error
    except (ValueError, UnsupportedAlgorithm) as error:
        raise TlsFileError(
            f"{path} holds no PEM private key",
            KEY_SETTING,
            "give the certificate's private key as PEM (-----BEGIN PRIVATE KEY-----)",
        ) from error


def _public_der(certificate: x509.Certificate) -> bytes:
    return certificate.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _public_key_der(key: PrivateKeyTypes) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _pem(certificates: list[x509.Certificate]) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certificates)


def _warn_if_expired(certificates: CertificateSet) -> None:
    if certificates.certificate.not_valid_after_utc < datetime.datetime.now(datetime.UTC):
        log.warning(
            "the TLS certificate has expired: clients will refuse it (%s)",
            certificates.describe(),
        )


class ServerCertificates:
    """The certificate the server serves, and the one new handshakes take after a reload."""

    def __init__(self, files: TlsFiles, current: CertificateSet) -> None:
        self.files = files
        self.current = current
        """What new connections get (once a handshake took it, after a reload)."""
        self._next: grpc.ServerCertificateConfiguration | None = None
        self._lock = threading.Lock()  # gRPC calls `_take_next` on its own threads

    @classmethod
    def load(cls, settings: Settings) -> ServerCertificates | None:
        """The configured TLS material, checked; None for plaintext. Raises TlsFileError."""
        files = TlsFiles.from_settings(settings)
        if files is None:
            return None
        current = read_certificates(files)
        _warn_if_expired(current)
        return cls(files, current)

    @property
    def mutual(self) -> bool:
        """Whether clients must present a certificate."""
        return self.files.client_ca_file is not None

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self.current.configuration(),
            self._take_next,
            require_client_authentication=self.mutual,
        )

    def reload(self) -> bool:
        """Read the files again; when they pass the checks, new connections get them.
        Returns whether they did (else the current ones stay, and an ERROR is logged)."""
        try:
            fresh = read_certificates(self.files)
        except TlsFileError as error:
            log.error(
                "TLS files not reloaded, new connections still get %s: %s",
                self.current.describe(),
                error,
            )
            return False
        _warn_if_expired(fresh)
        with self._lock:
            self._next = fresh.configuration()
            self.current = fresh
        log.info("TLS files reloaded: new connections get %s", fresh.describe())
        return True

    def _take_next(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC's question before each handshake: a new configuration, once, or None (keep
        the one it has)."""
        with self._lock:
            taken, self._next = self._next, None
        return taken
