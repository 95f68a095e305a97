"""TLS files for tests: a CA made on the spot, the server's certificate and key, a client's,
all written into a directory; and what certificate a server serves a new connection."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from agio_grpc.client import TlsConfig
from agio_grpc.testing.certificates import CertificateAuthority, KeyPair


@dataclass
class Pki:
    """A CA's certificate, a server's and a client's, as files in `directory`."""

    directory: Path
    ca: CertificateAuthority
    server: KeyPair
    client: KeyPair

    @classmethod
    def create(cls, directory: Path, ca_name: str = "agio-grpc test CA") -> Pki:
        directory.mkdir(parents=True, exist_ok=True)
        ca = CertificateAuthority(ca_name)
        pki = cls(directory, ca, ca.issue_server(), ca.issue_client())
        ca.write(directory)
        pki.server.write(directory, "server")
        pki.client.write(directory, "client")
        return pki

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def server_cert(self) -> Path:
        return self.directory / "server.pem"

    @property
    def server_key(self) -> Path:
        return self.directory / "server.key"

    def server_settings(self, *, mutual: bool = False) -> dict[str, Path]:
        """The settings of a server with these files (mutual: clients need a certificate)."""
        settings = {"tls_cert_file": self.server_cert, "tls_key_file": self.server_key}
        if mutual:
            settings["tls_client_ca_file"] = self.ca_file
        return settings

    def client_tls(self, *, with_certificate: bool = False) -> TlsConfig:
        """A client trusting this CA, presenting its certificate when `with_certificate`."""
        if not with_certificate:
            return TlsConfig(ca_file=self.ca_file)
        return TlsConfig(
            ca_file=self.ca_file,
            cert_file=self.directory / "client.pem",
            key_file=self.directory / "client.key",
        )

    def rotate_server(self, ca: CertificateAuthority | None = None) -> KeyPair:
        """Overwrite the server's files with a new certificate (from `ca`, else this CA)."""
        self.server = (ca or self.ca).issue_server()
        self.server.write(self.directory, "server")
        return self.server


async def served_certificate(address: str, ca_pem: bytes) -> x509.Certificate:
    """The certificate the server at `address` presents to a new TLS connection that trusts
    only `ca_pem` (ssl.SSLError when it does not verify)."""
    context = ssl.create_default_context(cadata=ca_pem.decode())
    context.set_alpn_protocols(["h2"])
    host, _, port = address.rpartition(":")
    _, writer = await asyncio.open_connection(host, int(port), ssl=context, server_hostname=host)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
    return x509.load_der_x509_certificate(der)
