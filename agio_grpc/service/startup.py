"""Start-up failures an operator can fix, each said in one line: what failed, which setting,
and how to fix it. `agio-grpc serve` prints the line and exits 2 (the traceback only with
`--debug`).

`AgioApp.start` raises `StartupError` for the store (its URL, the database behind it, its
migrations), the tools and hooks it imports, the TLS files (service/tls.py), and the listen
address, which `check_bindable` tries before anything else is started, so that a taken port
fails at once and without gRPC's own log line.
"""

from __future__ import annotations

import contextlib
import errno
import re
import socket
from collections.abc import Iterator, Mapping

from sqlalchemy import make_url
from sqlalchemy.exc import ArgumentError

from agio_grpc.store.errors import SchemaTooNewError, StoreError


class StartupError(Exception):
    """The service cannot start; `str()` is the one line to show."""

    def __init__(self, what: str, setting: str, fix: str) -> None:
        super().__init__(what, setting, fix)
        self.what = what
        self.setting = setting
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.what} [{self.setting}]: {self.fix}"


def shown_url(url: str) -> str:
    """A database URL with its password hidden."""
    with contextlib.suppress(ArgumentError, ValueError):
        return make_url(url).render_as_string(hide_password=True)
    return "(not a URL)"


@contextlib.contextmanager
def opening_store(url: str) -> Iterator[None]:
    """Turn a store that cannot open (bad URL, database down, failed migration) into a
    StartupError naming AGIO_DATABASE_URL."""
    setting = f"AGIO_DATABASE_URL={shown_url(url)}"
    try:
        yield
    except ValueError as error:
        raise StartupError(
            f"bad database URL: {one_line(error)}",
            setting,
            "use sqlite+aiosqlite:///path/agio.db or postgresql+asyncpg://user:password@host/db",
        ) from error
    except SchemaTooNewError as error:
        raise StartupError(
            one_line(error),
            setting,
            "run the version of agio-grpc that migrated it (or a later one), or point "
            "AGIO_DATABASE_URL at a database this version made",
        ) from error
    except StoreError as error:
        raise StartupError(
            one_line(error),
            setting,
            "check that the database is up and reachable with these credentials, "
            "or unset AGIO_DATABASE_URL for the SQLite file agio.db",
        ) from error


@contextlib.contextmanager
def loading(what: str, setting: str) -> Iterator[None]:
    """Turn a tool module or hook that cannot be imported or used into a StartupError."""
    try:
        yield
    except (ValueError, TypeError) as error:
        raise StartupError(
            f"cannot load the {what}: {one_line(error)}",
            setting,
            "check the name (package.module or package.module:attribute) and that the module "
            "imports from the server's Python path (PYTHONPATH)",
        ) from error


_FREE_PORT = "stop what uses that port or choose another one (port 0: any free port)"


def cannot_listen(
    address: str, reason: str, fix: str = _FREE_PORT, setting: str = "AGIO_LISTEN_ADDRESS"
) -> StartupError:
    return StartupError(f"cannot listen on {address}: {reason}", setting, fix)


def check_bindable(address: str, setting: str = "AGIO_LISTEN_ADDRESS") -> None:
    """Raise StartupError (naming `setting`) when no address `address` resolves to can be
    bound now (as gRPC itself binds: the server listens if any of them binds). Port 0 always
    can."""
    host, _, port = address.rpartition(":")
    if port == "0":
        return
    host = host.removeprefix("[").removesuffix("]")
    try:
        resolved = socket.getaddrinfo(
            host or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (OSError, ValueError) as error:
        raise cannot_listen(
            address, f"the host does not resolve ({error})", setting=setting
        ) from error
    failures: list[OSError] = []
    for family, kind, protocol, _, socket_address in resolved:
        try:
            with socket.socket(family, kind, protocol) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(socket_address)
                return
        except OSError as error:
            failures.append(error)
    if failures:
        first = failures[0]
        if first.errno == errno.EADDRNOTAVAIL:
            fix = "use an address of this machine (127.0.0.1, or 0.0.0.0 for every interface)"
            reason = "this machine has no such address"
            raise cannot_listen(address, reason, fix, setting) from first
        if first.errno == errno.EACCES:
            fix = "use a port above 1023, or give the process the right to bind below"
            raise cannot_listen(address, "permission denied", fix, setting) from first
        reason = "the port is in use" if first.errno == errno.EADDRINUSE else one_line(first)
        raise cannot_listen(address, reason, setting=setting) from first


def one_line(error: BaseException) -> str:
    """An exception's message on one line."""
    return " ".join(str(error).split()) or type(error).__name__


_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def substitute(value: str, environ: Mapping[str, str], setting: str) -> str:
    """`value` with each `${NAME}` replaced by the variable NAME of `environ`; `$${` keeps a
    literal `${`. Raises StartupError naming a missing variable (never a value)."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in environ:
            raise StartupError(
                f"environment variable {name} is not set",
                setting,
                f"set {name} in the service's environment, or write the value in the config",
            )
        return environ[name]

    parts = value.split("$${")
    return "${".join(_VARIABLE.sub(replace, part) for part in parts)
