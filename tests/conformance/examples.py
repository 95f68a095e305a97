"""The examples scenario: the README's examples, the CLIs and the relay against live servers.

Run by scripts/conformance.py (after it built examples/ and examples/ts) with the same two
servers as the client scenario (tests/conformance/scenario.py says what they are). Checks:

- `go_quickstart`, `ts_quickstart`: examples/go/quickstart and examples/ts/quickstart.ts,
  pointed at the fast server by `AGIO_ADDRESS` alone, print what QUICKSTART_OUTPUT says:
  the answer and the stop reason's name, then the session's steps with their roles' names.
  (tests/examples runs the Python examples against a server of its own.)
- `python_cli_address`, `go_cli_address`, `ts_cli_address`: each language's `agio-chat`
  run with `AGIO_ADDRESS` and no address flag reaches the server and prints the answer.
- `relay`: examples/relay's `go test` (a run re-streamed in the caller's trace, agio's
  errors passed on, the caller's cancel cancelling agio's run).
- `python_cli_mutual_tls`, `go_cli_mutual_tls`, `ts_cli_mutual_tls` (with `--mtls-address`):
  each `agio-chat` reaches a server that asks for a client certificate, by the variables
  alone: AGIO_ADDRESS, AGIO_CA_FILE, AGIO_CERT_FILE, AGIO_KEY_FILE and AGIO_TOKEN, which
  scripts/conformance.py sets for this run.

Prints one `ok NAME` or `FAIL NAME: why` line per check; exits 1 when any check failed.
`python -m tests.conformance.examples --address HOST:PORT --slow-address HOST:PORT`
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLES = ROOT / "examples"
AGIO = Path(sys.executable).parent / "agio-grpc"
CHECK_TIMEOUT = 120.0
QUESTION = "What is 12 * 7?"
CONNECTION_VARIABLES = ("AGIO_TOKEN", "AGIO_CA_FILE", "AGIO_CERT_FILE", "AGIO_KEY_FILE")
"""How the CLIs reach a server over TLS, besides AGIO_ADDRESS."""

# What every quickstart prints on the built-in fake model, in each language's own spelling
# of the enum names (Python and Go: STOP_REASON_COMPLETED, ROLE_USER; TypeScript: COMPLETED,
# USER). A number where a name belongs does not match.
QUICKSTART_OUTPUT = re.compile(
    r"The result is 84\. (?:STOP_REASON_)?COMPLETED\n"
    r"1 (?:ROLE_)?USER What is 12 \* 7\?\n"
    r"2 (?:ROLE_)?ASSISTANT calculate\(\{.*\}\)\n"
    r"3 (?:ROLE_)?TOOL 84\n"
    r"4 (?:ROLE_)?ASSISTANT The result is 84\.\n"
)


def quickstart_printed_names(output: str) -> bool:
    """Whether `output` is what a quickstart prints: names, not numbers."""
    return QUICKSTART_OUTPUT.fullmatch(output) is not None


def printed_the_answer(output: str) -> bool:
    return "84" in output


def exited_zero(output: str) -> bool:
    return True


@dataclass(frozen=True)
class Check:
    """One command, and what its standard output must hold (beyond exit status 0)."""

    name: str
    command: list[str]
    cwd: Path
    expect: Callable[[str], bool] = exited_zero
    env: dict[str, str] = field(default_factory=dict)
    """Variables set for this check over the common ones."""


def cli_checks(suffix: str, env: dict[str, str] | None = None) -> list[Check]:
    """The three `agio-chat`s, each asked QUESTION with no flags: the variables decide."""
    answer, env = printed_the_answer, env or {}
    return [
        Check(f"python_cli_{suffix}", [str(AGIO), "chat", QUESTION], ROOT, answer, env),
        Check(
            f"go_cli_{suffix}",
            ["go", "run", "./cmd/agio-chat", QUESTION],
            ROOT / "clients" / "go",
            answer,
            env,
        ),
        Check(
            f"ts_cli_{suffix}",
            ["node", "dist/cli/agio-chat.js", QUESTION],
            ROOT / "clients" / "ts",
            answer,
            env,
        ),
    ]


def checks(mtls_address: str | None = None) -> list[Check]:
    quickstart = quickstart_printed_names
    mutual_tls = {key: os.environ[key] for key in CONNECTION_VARIABLES if key in os.environ}
    return [
        Check("go_quickstart", ["go", "run", "./go/quickstart"], EXAMPLES, quickstart),
        Check("ts_quickstart", ["node", "dist/quickstart.js"], EXAMPLES / "ts", quickstart),
        *cli_checks("address"),
        Check(
            "relay",
            ["go", "test", "-count=1", "-timeout=120s", "-v", "-run", "^TestRelay$", "./relay"],
            EXAMPLES,
        ),
        *(
            cli_checks("mutual_tls", mutual_tls | {"AGIO_ADDRESS": mtls_address})
            if mtls_address
            else []
        ),
    ]


def run_check(check: Check, env: dict[str, str]) -> str | None:
    """Run one check in its own process group (killed whole past CHECK_TIMEOUT): None when
    it passed, else why not."""
    process = subprocess.Popen(
        check.command,
        cwd=check.cwd,
        env=env | check.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        output, errors = process.communicate(timeout=CHECK_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        return f"timed out after {CHECK_TIMEOUT:.0f}s"
    if process.returncode != 0:
        return f"exit {process.returncode}:\n{output}{errors}"
    if not check.expect(output):
        return f"unexpected output:\n{output}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="agio-grpc examples against live servers")
    parser.add_argument("--address", required=True, help="server on the built-in fake model")
    parser.add_argument("--slow-address", required=True, help="server on a paced fake model")
    parser.add_argument(
        "--mtls-address",
        help="a server over mutual TLS (the client's files and token in the AGIO_* variables)",
    )
    args = parser.parse_args(argv)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGIO_")} | {
        "AGIO_ADDRESS": args.address,
        "AGIO_CONFORMANCE_ADDRESS": args.address,
        "AGIO_CONFORMANCE_SLOW_ADDRESS": args.slow_address,
    }
    failed = 0
    for check in checks(args.mtls_address):
        why = run_check(check, env)
        if why is None:
            print(f"ok {check.name}", flush=True)
        else:
            failed += 1
            print(f"FAIL {check.name}: {why}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
