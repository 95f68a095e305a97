"""Client conformance: the Python, Go and TypeScript clients against live servers.

First builds the Go and TypeScript clients and runs their unit tests (`go vet`, `go test`;
`npm ci`, `tsc`), and the examples (`go vet`, `go test` in examples/; `npm ci`, `tsc` in
examples/ts, which links the built clients/ts). Then starts, all on 127.0.0.1 with port 0
and throwaway SQLite files:

- a paced fake model (`agio-grpc fake-model --tokens 200 --tokens-per-second 20`);
- a server on the built-in fake model (fast runs: "What is 12 * 7?" calls `calculate`);
- a server on the paced fake model (runs that last ten seconds, to cancel mid-stream);

and runs the one scenario (tests/conformance/scenario.py says what it checks) with each
client: `python -m tests.conformance.scenario`, `go test -run TestConformance` in clients/go
and `node dist/conformance/scenario.js` in clients/ts; then the examples scenario
(`python -m tests.conformance.examples`: the Go and TypeScript quickstarts, the three CLIs
reaching the server by `AGIO_ADDRESS`, and examples/relay's test). Prints one line per client
(and `examples`) and a final `N passed, N failed` line; exits 1 when any failed. Every step
has a time limit and every process started here is stopped here.

`uv run python scripts/conformance.py [--clients python,go,ts,examples]`
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AGIO = Path(sys.executable).parent / "agio-grpc"
START_TIMEOUT = 60.0
BUILD_TIMEOUT = 600.0
SCENARIO_TIMEOUT = 300.0
# 200 one-word chunks at 20 a second: a run on the slow server streams for ten seconds.
PACED_MODEL = ["--port", "0", "--tokens", "200", "--tokens-per-second", "20"]
FAILED_CHECK = re.compile(r"^(?:FAIL (\w+)|\s*--- FAIL: TestConformance/(\w+))", re.MULTILINE)


@dataclass
class Outcome:
    """What one bounded command did."""

    returncode: int
    output: str
    seconds: float


def run_bounded(command: list[str], cwd: Path, timeout: float, env: dict[str, str]) -> Outcome:
    """Run `command` in its own process group; kill the whole group past `timeout`."""
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        output += f"\n(timed out after {timeout:.0f}s)"
        return Outcome(124, output, time.monotonic() - started)
    return Outcome(process.returncode, output, time.monotonic() - started)


@dataclass
class Started:
    """A background process and the file it logs to."""

    process: subprocess.Popen[bytes]
    log: Path

    def wait_for(self, pattern: str) -> str:
        """The first group of `pattern` once it is logged (bounded by START_TIMEOUT)."""
        deadline = time.monotonic() + START_TIMEOUT
        regex = re.compile(pattern)
        while time.monotonic() < deadline:
            found = regex.search(self.log.read_text(errors="replace"))
            if found:
                return found.group(1)
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        text = self.log.read_text(errors="replace")
        raise RuntimeError(f"{self.log.name}: no {pattern!r}:\n{text}")


class Processes:
    """Background processes, each logging to a file, all stopped on exit."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, name: str, command: list[str], env: dict[str, str]) -> Started:
        log = self.scratch / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                command,
                cwd=self.scratch,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self.started.append(process)
        return Started(process, log)

    def stop_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.started:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "AGIO_"))}
    env.setdefault("OTEL_TRACES_EXPORTER", "none")
    env.setdefault("OTEL_METRICS_EXPORTER", "none")
    env.setdefault("OTEL_LOGS_EXPORTER", "none")
    return env


@contextlib.contextmanager
def live_servers(scratch: Path) -> Iterator[tuple[str, str]]:
    """(fast address, slow address) of two servers, stopped on exit."""
    processes = Processes(scratch)
    listening = r"agio-grpc listening on (\S+:\d+)"
    try:
        # The fast server needs nothing else: start it first, alongside the fake model.
        model = processes.start("fake-model", [str(AGIO), "fake-model", *PACED_MODEL], base_env())
        fast = processes.start("server-fast", [str(AGIO), "serve"], server_env(scratch, "fast"))
        model_url = model.wait_for(r"fake model listening on (\S+)")
        slow_env = server_env(scratch, "slow") | {
            "OPENAI_BASE_URL": model_url,
            "OPENAI_API_KEY": "conformance",
        }
        slow = processes.start("server-slow", [str(AGIO), "serve"], slow_env)
        yield fast.wait_for(listening), slow.wait_for(listening)
    finally:
        processes.stop_all()


def server_env(scratch: Path, name: str) -> dict[str, str]:
    return base_env() | {
        "AGIO_LISTEN_ADDRESS": "127.0.0.1:0",
        "AGIO_DATABASE_URL": f"sqlite+aiosqlite:///{scratch / name}.db",
    }


def build_commands() -> dict[str, list[tuple[list[str], Path]]]:
    go, ts = ROOT / "clients" / "go", ROOT / "clients" / "ts"
    examples = ROOT / "examples"
    npm_ci = ["npm", "ci", "--no-audit", "--no-fund"]
    ts_build = [(npm_ci, ts), (["npm", "run", "build"], ts)]
    return {
        "python": [],
        "go": [(["go", "vet", "./..."], go), (["go", "test", "./..."], go)],
        "ts": ts_build,
        # The TypeScript example links clients/ts, and the CLI checks run its build.
        "examples": [
            (["go", "vet", "./..."], examples),
            (["go", "test", "./..."], examples),
            *ts_build,
            (npm_ci, examples / "ts"),
            (["npm", "run", "build"], examples / "ts"),
        ],
    }


def scenario_command(client: str, fast: str, slow: str) -> tuple[list[str], Path]:
    addresses = ["--address", fast, "--slow-address", slow]
    if client == "python":
        return [sys.executable, "-m", "tests.conformance.scenario", *addresses], ROOT
    if client == "examples":
        return [sys.executable, "-m", "tests.conformance.examples", *addresses], ROOT
    if client == "go":
        command = [
            "go",
            "test",
            "-count=1",
            "-timeout=180s",
            "-v",
            "-run",
            "^TestConformance$",
            ".",
        ]
        return command, ROOT / "clients" / "go"
    return ["node", "dist/conformance/scenario.js", *addresses], ROOT / "clients" / "ts"


def indent(text: str) -> str:
    return "".join(f"    {line}\n" for line in text.strip().splitlines())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="python,go,ts,examples", help="comma-separated subset")
    args = parser.parse_args(argv)
    clients = [c for c in args.clients.split(",") if c]
    passed = failed = 0
    broken: set[str] = set()
    built: set[tuple[tuple[str, ...], Path]] = set()
    for client in clients:
        for command, cwd in build_commands()[client]:
            if (tuple(command), cwd) in built:
                continue
            outcome = run_bounded(command, cwd, BUILD_TIMEOUT, base_env())
            if outcome.returncode != 0:
                print(f"{client}: FAIL (build: {' '.join(command)})\n{indent(outcome.output)}")
                broken.add(client)
                break
            built.add((tuple(command), cwd))
    with tempfile.TemporaryDirectory(prefix="agio-conformance-") as scratch:
        started = time.monotonic()
        with live_servers(Path(scratch)) as (fast, slow):
            print(f"servers up in {time.monotonic() - started:.1f}s: fast {fast}, slow {slow}")
            for client in clients:
                if client in broken:
                    failed += 1
                    continue
                command, cwd = scenario_command(client, fast, slow)
                env = base_env() | {
                    "AGIO_CONFORMANCE_ADDRESS": fast,
                    "AGIO_CONFORMANCE_SLOW_ADDRESS": slow,
                }
                outcome = run_bounded(command, cwd, SCENARIO_TIMEOUT, env)
                checks = sorted({a or b for a, b in FAILED_CHECK.findall(outcome.output)})
                if outcome.returncode == 0:
                    passed += 1
                    print(f"{client}: PASS ({outcome.seconds:.1f}s)")
                else:
                    failed += 1
                    why = ", ".join(checks) or f"exit {outcome.returncode}"
                    print(f"{client}: FAIL ({why}; {outcome.seconds:.1f}s)")
                    print(indent(outcome.output), end="")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
