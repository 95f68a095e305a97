"""The `agio-grpc` command: the service, the fake model, and a client for a running server.

    serve [--workers N|auto]               run the gRPC service (settings from AGIO_* variables)
    fake-model [--port N]                  run the built-in fake OpenAI-compatible model
    chat MESSAGE [--session S] [--agent A] [--client-tool FILE.json]... [--background]
                 [--on-busy reject|enqueue|interrupt|rollback] [--output-schema FILE.json]
                 [--require-approval TOOL]...
    retry SESSION --from N                 delete steps from #N on (2..last+1) and regenerate
    submit RUN CALL_ID=OUTPUT|CALL_ID=@FILE...   answer a run's client tool calls
    fork SESSION [--at N]                  a new session with steps #1..#N (#N kept; 0: all)
    sessions list [--limit N] [--page-token T] | show SESSION | delete SESSION
    sessions compact SESSION [--keep N] [--agent A]   summarize older steps now
    runs list [--session S] [--limit N] [--page-token T] | show RUN
         | cancel RUN [--reason TEXT] | watch RUN [--after SEQ]
                                           (a session is named by --session, a run by its id)
    watch RUN [--after SEQ]                `runs watch`
    approvals list [--session S] [--limit N]   calls waiting for a decision
    approve RUN CALL [--reject] [--reason TEXT]   decide one; the run goes on
    steps SESSION                          a session's steps (`sessions show` without the session)
    agents [-v]                            the agents and their tools
    keys create --tenant T [--name N] | list [--tenant T] | revoke ID
                                           API keys (auth.mode api_key), in AGIO_DATABASE_URL

Every client command takes `--address` (default: AGIO_ADDRESS, else 127.0.0.1:50051; several
servers as `IP:PORT,IP:PORT` or a `dns:///NAME:PORT`, which the calls go to round robin) and
`--json`: proto3 JSON on stdout (field names as in the .proto, enums by name), one document,
or for a run's events one StepEvent per line (JSON Lines). To reach a server that wants
them: `--token` (default: AGIO_TOKEN), sent as `authorization: Bearer`; TLS with
`--ca-file` (AGIO_CA_FILE), or `--tls` for gRPC's default roots; mutual TLS adds
`--cert-file` and `--key-file` (AGIO_CERT_FILE, AGIO_KEY_FILE). Exit codes: 0 done, 1 the
run failed or the server refused the call (one line on stderr: `agio-grpc: CODE [REASON]:
...`), 2 a usage error, 130 Ctrl-C (which cancels the run of `chat`, `retry` and `submit`,
and leaves a watched one running: stderr says which).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from agio_grpc.cli import commands
from agio_grpc.cli.client_tools import (
    output_schema_file,
    tool_definition_file,
    tool_output_argument,
)
from agio_grpc.cli.keys import add_keys_parser, cmd_keys
from agio_grpc.cli.serve import cmd_serve, workers_argument

__all__ = ["build_parser", "main"]

DEFAULT_ADDRESS = "127.0.0.1:50051"

_TOOL_OUTPUTS_FROM_STDIN = """\
When the run stops waiting for client tool calls (REQUIRES_ACTION), their outputs are read
from stdin, one line per call, in the order the calls are listed (the `tool_calls` of the
stop signal's context); on a terminal each call is shown, with its arguments, and prompted
for. The outputs are submitted and the continued run printed, until the run ends. When
stdin ends first the run is left waiting: answer it later with `agio-grpc submit`.
"""

_CTRL_C = """\
Ctrl-C cancels the run, as a run stops when its caller leaves (stderr says so; exit code
130). `chat --background` starts a run that goes on without the command.
"""

_CLIENT_TOOL_FILE = """\
A --client-tool file holds one JSON object: {"name": ..., "description": ...,
"parameters": {JSON schema of the arguments}} (or "parameters_json": the schema as text).
"""


def _at_least(minimum: int, why: str = "") -> Callable[[str], int]:
    """An argparse type: an integer of at least `minimum` (`why` says why, if not plain)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}{why}, got {value}")
        return value

    return parse


_positive = _at_least(1)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agio-grpc",
        description=__doc__.splitlines()[0] if __doc__ else None,
        epilog=__doc__.split("\n\n", 2)[2] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    top = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = top.add_parser("serve", help="run the gRPC service (settings from AGIO_* variables)")
    serve.add_argument(
        "--debug",
        action="store_true",
        help="log at DEBUG, and show the traceback of a start-up error",
    )
    serve.add_argument(
        "--workers",
        type=workers_argument,
        metavar="N|auto",
        help="worker processes serving the port (default: server.workers, AGIO_SERVER__WORKERS, "
        "else 1; auto: one per core)",
    )
    # How the supervisor of `--workers N` starts each of its workers (service/supervisor.py).
    serve.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    serve.add_argument("--supervisor-fd", type=int, help=argparse.SUPPRESS)
    top.add_parser(
        "fake-model", help="run the built-in fake OpenAI-compatible model", add_help=False
    )

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--address",
        default=os.environ.get("AGIO_ADDRESS", DEFAULT_ADDRESS),
        help="the server, or several: host:port,host:port or dns:///host:port, called round "
        "robin (default: AGIO_ADDRESS, else %(default)s)",
    )
    _add_connection_options(common)
    common.add_argument(
        "--json",
        action="store_true",
        help="proto3 JSON on stdout: one document, or one StepEvent per line for a run",
    )

    def command(
        group: argparse._SubParsersAction[argparse.ArgumentParser],
        name: str,
        handler: commands.Command,
        summary: str,
        epilog: str | None = None,
    ) -> argparse.ArgumentParser:
        sub = group.add_parser(
            name,
            help=summary,
            description=summary,
            epilog=epilog,
            parents=[common],
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.set_defaults(handler=handler)
        return sub

    chat = command(
        top,
        "chat",
        commands.chat,
        "stream one run in the terminal",
        _TOOL_OUTPUTS_FROM_STDIN + "\n" + _CLIENT_TOOL_FILE + "\n" + _CTRL_C,
    )
    chat.add_argument("message")
    chat.add_argument("--session", default="", help="continue this session")
    chat.add_argument("--agent", default="", help="agent name (default agent when empty)")
    chat.add_argument(
        "--client-tool",
        action="append",
        default=[],
        type=tool_definition_file,
        metavar="FILE.json",
        help="offer a tool you answer yourself (repeatable)",
    )
    chat.add_argument(
        "--output-schema",
        type=output_schema_file,
        metavar="FILE.json",
        help="the answer must be JSON valid against this JSON Schema: print only that JSON "
        "(with --json, the whole final run)",
    )
    chat.add_argument(
        "--background",
        action="store_true",
        help="start the run and return (StartRun); print its id; follow it with `watch`",
    )
    chat.add_argument(
        "--on-busy",
        choices=sorted(commands.BUSY_POLICIES),
        default="reject",
        help="when the session has a running, queued or waiting run (default: reject)",
    )
    chat.add_argument(
        "--require-approval",
        action="append",
        default=[],
        metavar="TOOL",
        help="this server tool's calls wait for a decision (repeatable; `*`: every tool)",
    )

    retry = command(
        top,
        "retry",
        commands.retry,
        "delete a session's steps from #N on and regenerate; stream it like chat",
        _TOOL_OUTPUTS_FROM_STDIN + "\n" + _CTRL_C,
    )
    retry.add_argument("session_id", metavar="SESSION")
    retry.add_argument(
        "--from",
        dest="sequence",
        type=_at_least(2, " (step #1, the first message, stays to regenerate from)"),
        required=True,
        metavar="N",
        help="the first step deleted: 2..the last step's number + 1 (which deletes nothing "
        "and regenerates after the last step)",
    )

    submit = command(
        top,
        "submit",
        commands.submit,
        "answer a waiting run's client tool calls; stream it like chat",
        _TOOL_OUTPUTS_FROM_STDIN + "\n" + _CTRL_C,
    )
    submit.add_argument("run_id", metavar="RUN")
    submit.add_argument(
        "outputs",
        nargs="+",
        type=tool_output_argument,
        metavar="CALL_ID=OUTPUT",
        help="one per pending call; CALL_ID=@FILE reads the output from FILE",
    )

    fork = command(top, "fork", commands.fork, "copy a session's steps into a new one")
    fork.add_argument("session_id", metavar="SESSION")
    fork.add_argument(
        "--at",
        type=_at_least(0),
        default=0,
        metavar="N",
        help="the new session holds steps #1..#N, step #N kept (default 0: all of them)",
    )

    sessions = top.add_parser(
        "sessions", help="list, show, compact or delete sessions"
    ).add_subparsers(dest="action", required=True, metavar="ACTION")
    listed = command(sessions, "list", commands.list_sessions, "sessions, newest first")
    _add_paging(listed)
    shown = command(sessions, "show", commands.show_session, "a session and its steps")
    shown.add_argument("session_id", metavar="SESSION")
    deleted = command(
        sessions,
        "delete",
        commands.delete_session,
        "delete a session with its steps and runs (no confirmation)",
    )
    deleted.add_argument("session_id", metavar="SESSION")
    compacted = command(
        sessions,
        "compact",
        commands.compact_session,
        "summarize a session's older steps now (they stay in the log)",
    )
    compacted.add_argument("session_id", metavar="SESSION")
    compacted.add_argument(
        "--keep", type=int, default=0, help="steps kept after the summary (default: the agent's)"
    )
    compacted.add_argument("--agent", default="", help="whose settings apply (default agent)")

    runs = top.add_parser("runs", help="list, show, cancel or watch runs").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    listed = command(
        runs,
        "list",
        commands.list_runs,
        "runs, newest first: a session's, or without --session those of the newest sessions",
    )
    listed.add_argument(
        "--session", default="", help="this session's runs (default: the newest sessions')"
    )
    _add_paging(listed)
    shown = command(runs, "show", commands.show_run, "a run: status, stop signal, usage")
    shown.add_argument("run_id", metavar="RUN")
    cancel = command(runs, "cancel", commands.cancel_run, "cancel a run (an ended one stays)")
    cancel.add_argument("run_id", metavar="RUN")
    cancel.add_argument("--reason", default="", help="recorded in the stop signal")
    for group in (runs, top):
        watch = command(
            group,
            "watch",
            commands.watch,
            "follow a run to its end (replayed, then live; reconnects after a restart)",
        )
        watch.add_argument("run_id", metavar="RUN")
        watch.add_argument(
            "--after",
            type=_at_least(0),
            default=0,
            metavar="SEQ",
            help="only the events after this seq (the terminal event's: none, it ends at once)",
        )

    approvals = top.add_parser("approvals", help="the calls waiting for a decision").add_subparsers(
        dest="action", required=True, metavar="ACTION"
    )
    listed = command(
        approvals,
        "list",
        commands.list_approvals,
        "the calls waiting for approval: RUN CALL TOOL(ARGUMENTS)",
    )
    listed.add_argument(
        "--session", default="", help="this session's runs (default: the newest sessions')"
    )
    listed.add_argument(
        "--limit", type=_positive, default=100, metavar="N", help="runs looked at (default: 100)"
    )
    decide = command(
        top, "approve", commands.approve, "approve (or --reject) a call waiting for approval"
    )
    decide.add_argument("run_id", metavar="RUN")
    decide.add_argument("call_id", metavar="CALL")
    decide.add_argument("--reject", action="store_true", help="reject it: the call never runs")
    decide.add_argument("--reason", default="", help="why (the model sees it on a rejection)")

    steps = command(top, "steps", commands.steps, "print a session's steps")
    steps.add_argument("session_id", metavar="SESSION")
    agents = command(top, "agents", commands.agents, "list the configured agents")
    agents.add_argument("--verbose", "-v", action="store_true", help="show tool schemas")
    add_keys_parser(top)
    return parser


def _add_connection_options(parser: argparse.ArgumentParser) -> None:
    """The credential and TLS options, each defaulting to its AGIO_* variable. The token's
    value is never shown, not even in --help."""
    env = os.environ.get
    parser.add_argument(
        "--token",
        default=env("AGIO_TOKEN", ""),
        help="credential sent as `authorization: Bearer TOKEN` (default: AGIO_TOKEN)",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="use TLS, trusting gRPC's default roots (implied by --ca-file and --cert-file)",
    )
    parser.add_argument(
        "--ca-file",
        default=env("AGIO_CA_FILE") or None,
        metavar="PEM",
        help="use TLS, trusting the CAs in this file (default: AGIO_CA_FILE)",
    )
    parser.add_argument(
        "--cert-file",
        default=env("AGIO_CERT_FILE") or None,
        metavar="PEM",
        help="mutual TLS: this client's certificate (default: AGIO_CERT_FILE)",
    )
    parser.add_argument(
        "--key-file",
        default=env("AGIO_KEY_FILE") or None,
        metavar="PEM",
        help="mutual TLS: the key of --cert-file (default: AGIO_KEY_FILE)",
    )


def _add_paging(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit", type=_positive, default=20, metavar="N", help="at most N (default: 20)"
    )
    parser.add_argument(
        "--page-token",
        default="",
        metavar="TOKEN",
        help="continue where a listing stopped (it prints the token)",
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["fake-model"]:
        from agio_grpc.testing.cli import main as fake_model_main

        return fake_model_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        return cmd_serve(args)
    if args.command == "keys":
        return cmd_keys(args)
    if args.handler is commands.list_runs and args.page_token and not args.session:
        parser.error("runs list: --page-token needs --session")
    return commands.run_client(args.handler, args)
