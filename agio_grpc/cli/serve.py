"""`agio-grpc serve`: the gRPC service, configured by Settings (AGIO_* variables over the
optional AGIO_CONFIG file). Never talks to a server as a client."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import traceback

from pydantic import ValidationError


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


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the service until SIGTERM or SIGINT. A configuration or start-up error is one line
    on stderr and exit code 2 (with `--debug`, its traceback first)."""
    from agio_grpc.config import Settings
    from agio_grpc.service.app import serve
    from agio_grpc.service.startup import StartupError, one_line

    debug: bool = args.debug
    try:
        settings = Settings()
    except ValidationError as error:
        _explain(error, debug, configuration_lines(error))
        return 2
    except (FileNotFoundError, ValueError) as error:
        _explain(error, debug, [f"invalid configuration: {one_line(error)}"])
        return 2
    _configure_logging("DEBUG" if debug else settings.log_level)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(settings))
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
