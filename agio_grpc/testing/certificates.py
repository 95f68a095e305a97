"""Throwaway certificates for TLS tests and local set-ups: a CA made on the spot, and server
and client certificates it signs (ECDSA P-256).

The tests and scripts/conformance.py make their CA here; so can a developer trying TLS on one
machine (`python -m agio_grpc.testing.certificates DIR`, docs/tls.md). The keys are written
unencrypted and the CA's key is kept only in memory: never a production CA.

    ca = CertificateAuthority()
    server = ca.issue_server(["localhost", "127.0.0.1"])
    files = server.write(tmp_path, "server")   # server.pem, server.key
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
"""The names a server certificate is valid for unless told otherwise: this machine."""
_CLOCK_SKEW = datetime.timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    @property
    def serial(self) -> int:
        return self.certificate.serial_number

    def write(self, directory: Path, name: str) -> tuple[Path, Path]:
        """Write `NAME.pem` and `NAME.key` (readable by the owner only) into `directory`."""
        cert_file, key_file = directory / f"{name}.pem", directory / f"{name}.key"
        cert_file.write_bytes(self.cert_pem)
        key_file.touch(mode=0o600)
        key_file.write_bytes(self.key_pem)
        return cert_file, key_file


class CertificateAuthority:
    """A self-signed CA that issues server and client certificates."""

    def __init__(self, name: str = "agio-grpc test CA", days: int = 30) -> None:
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self._certificate = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _CLOCK_SKEW)
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_usage(cert_sign=True), critical=True)
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self._key.public_key()), critical=False
            )
            .sign(self._key, hashes.SHA256())
        )

    @property
    def cert_pem(self) -> bytes:
        return self._certificate.public_bytes(serialization.Encoding.PEM)

    def write(self, directory: Path, name: str = "ca") -> Path:
        """Write the CA's certificate (not its key) as `NAME.pem`."""
        path = directory / f"{name}.pem"
        path.write_bytes(self.cert_pem)
        return path

    def issue_server(self, hosts: Sequence[str] = DEFAULT_HOSTS, days: int = 30) -> KeyPair:
        """A server certificate for `hosts` (DNS names or IP addresses)."""
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        return self._issue(hosts[0], ExtendedKeyUsageOID.SERVER_AUTH, names, days)

    def issue_client(self, name: str = "agio-grpc test client", days: int = 30) -> KeyPair:
        """A client certificate whose subject's common name is `name`."""
        return self._issue(name, ExtendedKeyUsageOID.CLIENT_AUTH, [], days)

    def _issue(
        self,
        common_name: str,
        purpose: x509.ObjectIdentifier,
        names: list[x509.GeneralName],
        days: int,
    ) -> KeyPair:
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _CLOCK_SKEW)
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_usage(cert_sign=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([purpose]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()),
                critical=False,
            )
        )
        if names:
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        certificate = builder.sign(self._key, hashes.SHA256())
        return KeyPair(
            cert_pem=certificate.public_bytes(serialization.Encoding.PEM),
            key_pem=key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def main(argv: list[str] | None = None) -> int:
    """Write a CA and a server and a client certificate it signed into a directory."""
    parser = argparse.ArgumentParser(
        prog="python -m agio_grpc.testing.certificates",
        description="Write throwaway TLS files for trying agio-grpc on one machine: ca.pem, "
        "server.pem, server.key, client.pem, client.key (see docs/tls.md).",
    )
    parser.add_argument("directory", type=Path)
    parser.add_argument(
        "--host",
        action="append",
        default=[],
        help=f"a name the server certificate is valid for (repeatable; default: "
        f"{', '.join(DEFAULT_HOSTS)})",
    )
    parser.add_argument("--client-name", default="agio-grpc test client")
    parser.add_argument("--days", type=int, default=30, help="validity (default: %(default)s)")
    args = parser.parse_args(argv)
    directory: Path = args.directory
    directory.mkdir(parents=True, exist_ok=True)
    ca = CertificateAuthority(days=args.days)
    written = [
        ca.write(directory),
        *ca.issue_server(args.host or DEFAULT_HOSTS, args.days).write(directory, "server"),
        *ca.issue_client(args.client_name, args.days).write(directory, "client"),
    ]
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
