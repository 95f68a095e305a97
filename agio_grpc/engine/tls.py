"""`client_tls_context`: the one TLS context of every HTTPS client this process opens (the
model, MCP servers over HTTP, remote A2A agents, push notifications).

It trusts what the openai client trusts (httpx's: certifi's bundle, or `SSL_CERT_FILE` /
`SSL_CERT_DIR` as they are set when it is first made). Loading those certificates costs
about 27 ms of CPU, which every client used to pay for a context of its own: three times
per server start before anything was sent. A context is safe to share between clients and
threads; nothing here changes it after it is made. Never imports grpc.
"""

from __future__ import annotations

import functools
import ssl

import httpx2


@functools.cache
def client_tls_context() -> ssl.SSLContext:
    """The process's client TLS context, made on first use."""
    return httpx2.create_ssl_context()
