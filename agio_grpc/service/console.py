"""The run console's files, served at `/` of the HTTP listener.

The console is a page built from clients/ts/console (TypeScript on connect-web) into the
files beside this module (`npm run console` in clients/ts; committed, so serving it needs no
Node). It calls the services over Connect on the origin that served it, so the listener's
same-origin default lets it in. Only GET and HEAD of the page's own few paths are answered
here; everything else goes on to the Connect application. The page's configuration (the
trace link template) is served as `console-config.json`.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

from agio_grpc.config import HttpConfig

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]

FILES = Path(__file__).resolve().parent / "console"
_TYPES = {
    ".html": b"text/html; charset=utf-8",
    ".js": b"text/javascript; charset=utf-8",
    ".css": b"text/css; charset=utf-8",
    ".json": b"application/json",
}
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)


def console_files(config: HttpConfig) -> dict[str, tuple[bytes, bytes]]:
    """Path -> (content type, body) of every file the console serves."""
    files = {
        f"/{path.name}": (_TYPES[path.suffix], path.read_bytes())
        for path in sorted(FILES.iterdir())
        if path.suffix in _TYPES
    }
    if "/index.html" in files:
        files["/"] = files["/index.html"]
    files["/console-config.json"] = (
        _TYPES[".json"],
        json.dumps({"traceUrlTemplate": config.trace_url_template}).encode(),
    )
    return files


class ConsolePages:
    """Answers GET and HEAD of the console's files; passes every other request to `app`."""

    def __init__(self, app: AsgiApp, config: HttpConfig) -> None:
        self._app = app
        self._files = console_files(config) if config.console else {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = self._files.get(scope.get("path", "")) if scope["type"] == "http" else None
        if found is None or scope["method"] not in ("GET", "HEAD"):
            await self._app(scope, receive, send)
            return
        content_type, body = found
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", content_type),
                    (b"content-length", str(len(body)).encode()),
                    (b"cache-control", b"no-cache"),
                    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                ],
            }
        )
        await send(
            {
                "type": "http.response.body",
                "body": b"" if scope["method"] == "HEAD" else body,
                "more_body": False,
            }
        )
