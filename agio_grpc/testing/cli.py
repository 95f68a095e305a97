"""Run the fake model as a standalone process: `agio-grpc fake-model --port 8089`.

A separate process keeps benchmark load on the fake model off the event loop
of the server being measured. This module parses arguments and runs the
server until interrupted; it never configures the agio-grpc server itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib

from agio_grpc.testing.responders import Responder, default_responder, paced_responder
from agio_grpc.testing.server import FakeModelServer

DEFAULT_PORT = 8089


async def run_fake_model(host: str, port: int, *, default: Responder | None = None) -> None:
    """Serve the fake model on `host:port` until cancelled.

    Prints `fake model listening on http://HOST:PORT/v1` (the bound port when
    `port` is 0) once it accepts connections. `default` answers every request
    (no turns are ever enqueued here); `None` means `default_responder`.
    """
    async with FakeModelServer(host, port, default=default or default_responder) as server:
        print(f"fake model listening on {server.base_url}", flush=True)
        await asyncio.Event().wait()


def build_parser() -> argparse.ArgumentParser:
    """The `fake-model` command's arguments."""
    parser = argparse.ArgumentParser(
        prog="agio-grpc fake-model",
        description="Serve a deterministic OpenAI-compatible fake model over HTTP.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help="port to listen on (0 picks a free one)"
    )
    parser.add_argument(
        "--tokens",
        type=int,
        default=None,
        help="benchmark mode: answer with this many one-word chunks (see paced_responder)",
    )
    parser.add_argument(
        "--tokens-per-second",
        type=float,
        default=0.0,
        help="benchmark mode: streaming rate, 0 for as fast as possible",
    )
    parser.add_argument(
        "--no-tool-first",
        action="store_true",
        help="benchmark mode: do not call the calculate tool before streaming",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse `argv` (default: `sys.argv[1:]`), serve until Ctrl-C, return the exit code."""
    args = build_parser().parse_args(argv)
    responder = None
    if args.tokens is not None:
        responder = paced_responder(
            args.tokens, args.tokens_per_second, tool_first=not args.no_tool_first
        )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run_fake_model(args.host, args.port, default=responder))
    return 0
