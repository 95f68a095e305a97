"""The `agio-grpc` command: serve, fake-model, chat, watch, steps, agents.

`serve` reads Settings (environment over the optional AGIO_CONFIG file); the client
commands talk to a running server (`--address`, default `AGIO_ADDRESS` or 127.0.0.1:50051).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from pydantic import ValidationError

from agio_grpc.client import AgioClient, AgioError
from agio_grpc.v1 import agent_service_pb2, events_pb2, resources_pb2

DEFAULT_ADDRESS = "127.0.0.1:50051"


def _configure_logging(level: str) -> None:
    """Log lines to stderr, each with the trace and span id current when it was written."""
    from agio_grpc.telemetry import trace_log_handler
    from agio_grpc.telemetry.setup import capture_content_from_environment

    handler = trace_log_handler(
        logging.StreamHandler(sys.stderr), capture_content=capture_content_from_environment()
    )
    logging.basicConfig(level=level, handlers=[handler])
    if level == "INFO":
        # The HTTP client logs every model request at INFO: one line per model call, in a
        # service that makes thousands of them; its warnings and errors still show.
        logging.getLogger("httpx2").setLevel(logging.WARNING)


def cmd_serve(args: argparse.Namespace) -> int:
    from agio_grpc.config import Settings
    from agio_grpc.service.app import serve

    try:
        settings = Settings()
    except (ValidationError, FileNotFoundError, ValueError) as error:
        print(f"agio-grpc: invalid configuration:\n{error}", file=sys.stderr)
        return 2
    _configure_logging(settings.log_level)
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(settings))
    except OSError as error:
        print(f"agio-grpc: {error}", file=sys.stderr)
        return 1
    return 0


def _role(step: resources_pb2.Step) -> str:
    return resources_pb2.Role.Name(step.role).removeprefix("ROLE_").lower()


def _print_step(step: resources_pb2.Step) -> None:
    head = f"#{step.sequence:<4} {_role(step):<9}"
    if step.role == resources_pb2.ROLE_TOOL:
        flag = " (error)" if step.is_error else ""
        print(f"{head} {step.name}{flag}: {step.content}")
        return
    if step.content:
        print(f"{head} {step.content}")
    for call in step.tool_calls:
        print(f"{head} -> {call.name}({call.arguments})")


def _render_event(event: events_pb2.StepEvent, out: list[str]) -> None:
    kind = event.WhichOneof("event")
    if kind == "run_started":
        print(f"session {event.session_id}  run {event.run_id}", file=sys.stderr)
    elif kind == "step_delta" and event.step_delta.content:
        out.append(event.step_delta.content)
        print(event.step_delta.content, end="", flush=True)
    elif kind == "step_completed":
        step = event.step_completed.step
        if out:
            print()
            out.clear()
        if step.role == resources_pb2.ROLE_ASSISTANT:
            for call in step.tool_calls:
                print(f"  -> {call.name}({call.arguments})")
        elif step.role == resources_pb2.ROLE_TOOL:
            flag = " (error)" if step.is_error else ""
            print(f"  <- {step.name}{flag}: {step.content}")
    elif kind == "error":
        print(f"  ! {event.error.reason}: {event.error.message}", file=sys.stderr)
    elif kind in ("run_completed", "run_failed"):
        run = getattr(event, kind).run
        signal = run.stop_signal
        reason = resources_pb2.StopReason.Name(signal.reason).removeprefix("STOP_REASON_")
        usage = run.usage
        print(
            f"[{reason}] {signal.message} | tokens in {usage.input_tokens} "
            f"out {usage.output_tokens} | steps {run.step_count}",
            file=sys.stderr,
        )


_BUSY_POLICIES = {
    "reject": agent_service_pb2.BUSY_POLICY_REJECT,
    "enqueue": agent_service_pb2.BUSY_POLICY_ENQUEUE,
    "interrupt": agent_service_pb2.BUSY_POLICY_INTERRUPT,
    "rollback": agent_service_pb2.BUSY_POLICY_ROLLBACK,
}


async def _render(events: AsyncIterator[events_pb2.StepEvent]) -> int:
    """Print a run's events; 1 when it ended with `run_failed`."""
    out: list[str] = []
    final: events_pb2.StepEvent | None = None
    async for event in events:
        _render_event(event, out)
        final = event
    return 1 if final is not None and final.WhichOneof("event") == "run_failed" else 0


async def _chat(args: argparse.Namespace) -> int:
    async with AgioClient(args.address) as client:
        policy = _BUSY_POLICIES[args.on_busy]
        if args.background:
            run = await client.start_run(
                args.message, session_id=args.session, agent=args.agent, on_busy=policy
            )
            status = resources_pb2.RunStatus.Name(run.status).removeprefix("RUN_STATUS_")
            print(f"session {run.session_id}  run {run.id}  {status}", file=sys.stderr)
            print(run.id)  # the last line of stdout: for `agio-grpc watch`
            return 0
        events = client.run(args.message, session_id=args.session, agent=args.agent, on_busy=policy)
        return await _render(events)


async def _watch(args: argparse.Namespace) -> int:
    async with AgioClient(args.address) as client:
        return await _render(client.follow_run(args.run_id, args.after))


async def _steps(args: argparse.Namespace) -> int:
    async with AgioClient(args.address) as client:
        steps = await client.list_steps(args.session_id)
        for step in steps:
            _print_step(step)
    return 0


async def _agents(args: argparse.Namespace) -> int:
    async with AgioClient(args.address) as client:
        for agent in await client.list_agents():
            tools = ", ".join(tool.name for tool in agent.tools) or "no tools"
            print(f"{agent.name}  model={agent.model}  tools: {tools}")
            if args.verbose:
                for tool in agent.tools:
                    schema = json.dumps(json.loads(tool.parameters_json or "{}"))
                    print(f"    {tool.name}: {tool.description} {schema}")
    return 0


def _run_client(
    command: Callable[[argparse.Namespace], Coroutine[Any, Any, int]], args: argparse.Namespace
) -> int:
    try:
        return asyncio.run(command(args))
    except AgioError as error:
        print(f"agio-grpc: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agio-grpc", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("serve", help="run the gRPC service (settings from AGIO_* variables)")
    commands.add_parser(
        "fake-model", help="run the built-in fake OpenAI-compatible model", add_help=False
    )
    address = os.environ.get("AGIO_ADDRESS", DEFAULT_ADDRESS)

    chat = commands.add_parser("chat", help="stream one run in the terminal")
    chat.add_argument("message")
    chat.add_argument("--session", default="", help="continue this session")
    chat.add_argument("--agent", default="", help="agent name (default agent when empty)")
    chat.add_argument(
        "--background",
        action="store_true",
        help="start the run and return (StartRun); print its id; follow it with `watch`",
    )
    chat.add_argument(
        "--on-busy",
        choices=sorted(_BUSY_POLICIES),
        default="reject",
        help="when the session has a running, queued or waiting run (default: reject)",
    )
    chat.add_argument("--address", default=address)

    watch = commands.add_parser(
        "watch", help="follow a run to its end (replayed, then live; reconnects after a restart)"
    )
    watch.add_argument("run_id")
    watch.add_argument("--after", type=int, default=0, help="only the events after this seq")
    watch.add_argument("--address", default=address)

    steps = commands.add_parser("steps", help="print a session's steps")
    steps.add_argument("session_id")
    steps.add_argument("--address", default=address)

    agents = commands.add_parser("agents", help="list the configured agents")
    agents.add_argument("--verbose", "-v", action="store_true", help="show tool schemas")
    agents.add_argument("--address", default=address)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["fake-model"]:
        from agio_grpc.testing.cli import main as fake_model_main

        return fake_model_main(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return cmd_serve(args)
    handlers = {"chat": _chat, "watch": _watch, "steps": _steps, "agents": _agents}
    return _run_client(handlers[args.command], args)


if __name__ == "__main__":
    raise SystemExit(main())
