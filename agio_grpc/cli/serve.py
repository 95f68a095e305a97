"""`agio-grpc serve`: the gRPC service, configured by Settings (AGIO_* variables over the
optional AGIO_CONFIG file). Never talks to a server as a client."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import traceback
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING

from pydantic import ValidationError

if TYPE_CHECKING:
    from agio_grpc.config import Settings

log = logging.getLogger(__name__)


def _configure_logging(level: str) -> None:
    """Log lines to stderr, each with the trace and span id current when it was written, and
    the tenant of the call or run it was written for."""
    from agio_grpc.service.identity import current_caller
    from agio_grpc.telemetry import trace_log_handler
    from agio_grpc.telemetry.setup import capture_content_from_environment

    handler = trace_log_handler(
        logging.StreamHandler(sys.stderr),
        capture_content=capture_content_from_environment(),
        tenant=lambda: current_caller().tenant,
    )
    logging.basicConfig(level=level, handlers=[handler])
    if level == "INFO":
        # The HTTP client logs every model request at INFO: one line per model call, in a
        # service that makes thousands of them; its warnings and errors still show.
        logging.getLogger("httpx2").setLevel(logging.WARNING)


def workers_argument(text: str) -> int:
    """`--workers N|auto`, checked as `server.workers` is."""
    from agio_grpc.config import MAX_WORKERS, parse_workers

    try:
        value = parse_workers(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from error
    if not isinstance(value, int) or not 1 <= value <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"must be 1..{MAX_WORKERS} or auto, got {text!r}")
    return value


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the service until SIGTERM or SIGINT: one process, or with `server.workers` above
    1 a supervisor of that many (service/supervisor.py), or, with `--worker`, one of them.
    A configuration or start-up error is one line on stderr and exit code 2 (with
    `--debug`, its traceback first)."""
    from agio_grpc.config import Settings
    from agio_grpc.service.startup import StartupError, one_line

    debug: bool = args.debug
    try:
        settings = Settings(server={"workers": args.workers}) if args.workers else Settings()
    except ValidationError as error:
        _explain(error, debug, configuration_lines(error))
        return 2
    except (FileNotFoundError, ValueError) as error:
        _explain(error, debug, [f"invalid configuration: {one_line(error)}"])
        return 2
    # Imported before logging is set up, as the store's migration tool logs its plugins then.
    if args.worker is None and settings.server.workers > 1:
        main = _supervisor(settings, debug)
    else:
        debugging = debug or settings.log_level == "DEBUG"
        main = _server(settings, args.worker, args.supervisor_fd, debugging)
    _configure_logging("DEBUG" if debug else settings.log_level)
    if args.worker is None:  # said once, by the supervisor, not by each of its workers
        _warn_about(settings)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            return asyncio.run(main)
    except StartupError as error:
        _explain(error, debug, [f"cannot start: {error}"])
        return 2
    except Exception as error:
        lines = [f"stopped by an unexpected error: {one_line(error)}"]
        if not debug:
            lines.append("(`agio-grpc serve --debug` shows its traceback)")
        _explain(error, debug, lines)
        return 1
    return 0


def _warn_about(settings: Settings) -> None:
    """Settings that start a server which will not work as meant."""
    from agio_grpc.config import model_key_warning

    warning = model_key_warning(settings)
    if warning:
        log.warning("%s", warning)


async def _serve_until_stopped(serving: Awaitable[None]) -> int:
    await serving
    return 0


def _server(
    settings: Settings, worker_index: int | None, supervisor_fd: int | None, debugging: bool
) -> Coroutine[None, None, int]:
    """One server: alone, or one worker of a supervisor (naming itself in its responses
    when `debugging`)."""
    from agio_grpc.service.app import serve
    from agio_grpc.service.worker import WorkerRole

    worker = None
    if worker_index is not None and supervisor_fd is not None:
        worker = WorkerRole(worker_index, supervisor_fd, debug=debugging)
    return _serve_until_stopped(serve(settings, worker))


def _supervisor(settings: Settings, debug: bool) -> Coroutine[None, None, int]:
    """The supervisor of `server.workers` workers; it creates no gRPC object (it spawns
    fresh interpreters, never forks one)."""
    from agio_grpc.service.supervisor import Supervisor, worker_command

    return Supervisor(settings, worker_command(debug)).run()


_SHORT_FORMS = {"AGIO_AUTH__MODE": "AGIO_AUTH"}
"""Variables better known by a shorter name that sets the same (config.py `_EnvSource`)."""


def configuration_lines(error: ValidationError) -> list[str]:
    """One line per invalid setting: its name, the variable that sets it, what is wrong."""
    lines: list[str] = []
    for problem in error.errors(include_url=False, include_input=False):
        path = [str(part) for part in problem["loc"]]
        where = ".".join(path) or "(the settings)"
        variable = "AGIO_" + "__".join(path).upper() if path else "AGIO_CONFIG"
        variable = _SHORT_FORMS.get(variable, variable)
        message = problem["msg"].removeprefix("Value error, ")
        lines.append(f"invalid configuration: {where} [{variable}]: {message}")
    return lines


def _explain(error: BaseException, debug: bool, lines: list[str]) -> None:
    if debug:
        traceback.print_exception(error, file=sys.stderr)
    for line in lines:
        print(f"agio-grpc: {line}", file=sys.stderr)
