"""Client conformance: the Python, Go and TypeScript clients against live servers.

First builds the Go and TypeScript clients and runs their unit tests (`go vet`, `go test`;
`npm ci`, `tsc`, `npm test`), and the examples (`go vet`, `go test` in examples/; `npm ci`,
`tsc` in examples/ts, which links the built clients/ts). Then makes a CA and the server's and a
client's certificates (agio_grpc.testing.certificates, in the scratch directory), and
starts, all on 127.0.0.1 with port 0 and throwaway SQLite files:

- a paced fake model (`agio-grpc fake-model --tokens 200 --tokens-per-second 20`);
- for each transport (plaintext, TLS, mutual TLS: TRANSPORTS), a server on the built-in fake
  model (fast runs: "What is 12 * 7?" calls `calculate`) and a server on the paced fake
  model (runs that last ten seconds, to cancel mid-stream);

and runs the one scenario (tests/conformance/scenario.py says what it checks) with each
client over each transport: `python -m tests.conformance.scenario`, and the A2A scenario
with the official `a2a-sdk` client over its three bindings on the plaintext pair
(`python -m tests.conformance.a2a`), `go test -run
TestConformance` in clients/go and `node dist/conformance/scenario.js` in clients/ts (and
once more with `--protocol connect`: the TypeScript client's web transport on the plaintext
servers' HTTP listeners, `AGIO_HTTP_ADDRESS`), over TLS with the CA file and a token in the
variables every CLI reads (AGIO_CA_FILE, AGIO_TOKEN), over mutual TLS with the client's
certificate and key as well
(AGIO_CERT_FILE, AGIO_KEY_FILE). Then the examples scenario (`python -m
tests.conformance.examples`: the Go and TypeScript quickstarts, the three CLIs reaching the
plaintext server by `AGIO_ADDRESS` and the mutual TLS one by the variables, and
examples/relay's test). Prints one line per client and transport (and `examples`) and a
final `N passed, N failed` line; exits 1 when any failed. Every step has a time limit and
every process started here is stopped here.

`uv run python scripts/conformance.py [--clients python,go,ts,a2a,examples]
[--transports plaintext,tls,mutual_tls]`
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
from dataclasses import dataclass, field, replace
from pathlib import Path

from agio_grpc.testing.certificates import CertificateAuthority

ROOT = Path(__file__).resolve().parent.parent
AGIO = Path(sys.executable).parent / "agio-grpc"
START_TIMEOUT = 60.0
BUILD_TIMEOUT = 600.0
SCENARIO_TIMEOUT = 300.0
# 200 one-word chunks at 20 a second: a run on the slow server streams for ten seconds.
PACED_MODEL = ["--port", "0", "--tokens", "200", "--tokens-per-second", "20"]
FAILED_CHECK = re.compile(r"^(?:FAIL (\w+)|\s*--- FAIL: TestConformance/(\w+))", re.MULTILINE)
TRANSPORTS = ("plaintext", "tls", "mutual_tls")
HTTP_LISTENING = r"HTTP \(Connect, gRPC-Web\) on (\S+:\d+)"


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


@dataclass(frozen=True)
class Transport:
    """How the clients reach a pair of servers: the servers' settings and the clients'."""

    name: str
    server_env: dict[str, str] = field(default_factory=dict)
    client_env: dict[str, str] = field(default_factory=dict)


def make_api_key(database_url: str) -> str:
    """A key of tenant `conformance` in the store at `database_url`, made as an operator
    makes one (`agio-grpc keys create`, the key the last line of its output)."""
    made = subprocess.run(
        [str(AGIO), "keys", "create", "--tenant", "conformance", "--name", "conformance"],
        env=base_env() | {"AGIO_DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        check=True,
    )
    return made.stdout.splitlines()[-1]


def make_transports(scratch: Path) -> dict[str, Transport]:
    """Plaintext, no authentication; TLS with a CA made here and `api_key` authentication
    (both servers on one database, which holds the key); mutual TLS with `mtls`
    authentication, the client presenting a certificate of that CA (its tenant)."""
    directory = scratch / "tls"
    directory.mkdir()
    ca = CertificateAuthority("agio-grpc conformance CA")
    ca_file = ca.write(directory)
    server_cert, server_key = ca.issue_server().write(directory, "server")
    client_cert, client_key = ca.issue_client("conformance").write(directory, "client")
    server = {"AGIO_TLS_CERT_FILE": str(server_cert), "AGIO_TLS_KEY_FILE": str(server_key)}
    keyed_database = f"sqlite+aiosqlite:///{scratch / 'tls-api-key.db'}"
    api_key = {"AGIO_AUTH": "api_key", "AGIO_DATABASE_URL": keyed_database}
    client = {"AGIO_CA_FILE": str(ca_file)}
    return {
        # The plaintext servers also serve HTTP: the TypeScript client's web transport runs
        # the scenario once more over Connect there.
        "plaintext": Transport("plaintext", {"AGIO_HTTP_ADDRESS": "127.0.0.1:0"}),
        "tls": Transport(
            "tls", server | api_key, client | {"AGIO_TOKEN": make_api_key(keyed_database)}
        ),
        "mutual_tls": Transport(
            "mutual_tls",
            server | {"AGIO_AUTH": "mtls", "AGIO_TLS_CLIENT_CA_FILE": str(ca_file)},
            client | {"AGIO_CERT_FILE": str(client_cert), "AGIO_KEY_FILE": str(client_key)},
        ),
    }


@dataclass(frozen=True)
class ServerPair:
    """The fast and the slow server of one transport."""

    transport: Transport
    fast: str
    slow: str
    fast_http: str | None = None
    slow_http: str | None = None
    """Their HTTP listeners (Connect, gRPC-Web), when the transport asks for them."""


@contextlib.contextmanager
def live_servers(scratch: Path, transports: list[Transport]) -> Iterator[list[ServerPair]]:
    """A fast and a slow server per transport, stopped on exit."""
    processes = Processes(scratch)
    listening = r"agio-grpc listening on (\S+:\d+)"
    try:
        # The fast servers need nothing else: start them first, alongside the fake model.
        model = processes.start("fake-model", [str(AGIO), "fake-model", *PACED_MODEL], base_env())
        fast = [
            processes.start(
                f"server-fast-{transport.name}",
                [str(AGIO), "serve"],
                server_env(scratch, f"fast-{transport.name}") | transport.server_env,
            )
            for transport in transports
        ]
        model_url = model.wait_for(r"fake model listening on (\S+)")
        slow_model = {"OPENAI_BASE_URL": model_url, "OPENAI_API_KEY": "conformance"}
        slow = [
            processes.start(
                f"server-slow-{transport.name}",
                [str(AGIO), "serve"],
                server_env(scratch, f"slow-{transport.name}") | transport.server_env | slow_model,
            )
            for transport in transports
        ]
        pairs = []
        for transport, fast_server, slow_server in zip(transports, fast, slow, strict=True):
            pair = ServerPair(
                transport, fast_server.wait_for(listening), slow_server.wait_for(listening)
            )
            if "AGIO_HTTP_ADDRESS" in transport.server_env:
                pair = replace(
                    pair,
                    fast_http=fast_server.wait_for(HTTP_LISTENING),
                    slow_http=slow_server.wait_for(HTTP_LISTENING),
                )
            pairs.append(pair)
        yield pairs
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
        "a2a": [],
        "go": [(["go", "vet", "./..."], go), (["go", "test", "./..."], go)],
        "ts": [*ts_build, (["npm", "test"], ts)],
        # The TypeScript example links clients/ts, and the CLI checks run its build.
        "examples": [
            (["go", "vet", "./..."], examples),
            (["go", "test", "./..."], examples),
            *ts_build,
            (npm_ci, examples / "ts"),
            (["npm", "run", "build"], examples / "ts"),
        ],
    }


@dataclass(frozen=True)
class ScenarioRun:
    """One run of a client's scenario against one pair of servers."""

    label: str
    client: str
    servers: ServerPair
    mutual_tls: ServerPair | None = None
    """The examples only: the pair whose fast server their CLIs reach over mutual TLS."""
    protocol: str = "grpc"
    """`connect`: the TypeScript client's web transport, on the pair's HTTP listeners."""

    def env(self) -> dict[str, str]:
        env = base_env() | self.servers.transport.client_env
        if self.mutual_tls is not None:
            env |= self.mutual_tls.transport.client_env
        return env | {
            "AGIO_CONFORMANCE_ADDRESS": self.servers.fast,
            "AGIO_CONFORMANCE_SLOW_ADDRESS": self.servers.slow,
        }


def plan_runs(clients: list[str], servers: list[ServerPair]) -> list[ScenarioRun]:
    """Every client over every transport; the examples once, in plaintext (their CLIs over
    mutual TLS too)."""
    by_name = {pair.transport.name: pair for pair in servers}
    planned: list[ScenarioRun] = []
    for client in clients:
        if client == "a2a":
            # A2A's HTTP bindings need the HTTP listener, which the plaintext pair has.
            if "plaintext" in by_name:
                planned.append(ScenarioRun(client, client, by_name["plaintext"]))
            continue
        if client == "examples":
            if "plaintext" in by_name:
                planned.append(
                    ScenarioRun(client, client, by_name["plaintext"], by_name.get("mutual_tls"))
                )
            continue
        for name, pair in by_name.items():
            label = client if name == "plaintext" else f"{client} over {name}"
            planned.append(ScenarioRun(label, client, pair))
            if client == "ts" and pair.fast_http is not None:
                planned.append(ScenarioRun(f"{label} over Connect", client, pair, None, "connect"))
    return planned


def scenario_command(run: ScenarioRun) -> tuple[list[str], Path]:
    client = run.client
    addresses = ["--address", run.servers.fast, "--slow-address", run.servers.slow]
    if client == "python":
        return [sys.executable, "-m", "tests.conformance.scenario", *addresses], ROOT
    if client == "a2a":
        assert run.servers.fast_http is not None
        assert run.servers.slow_http is not None
        http = ["--http-address", run.servers.fast_http]
        http += ["--slow-http-address", run.servers.slow_http]
        return [sys.executable, "-m", "tests.conformance.a2a", *http], ROOT
    if client == "examples":
        mtls = ["--mtls-address", run.mutual_tls.fast] if run.mutual_tls else []
        return [sys.executable, "-m", "tests.conformance.examples", *addresses, *mtls], ROOT
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
    if run.protocol != "grpc":
        assert run.servers.fast_http is not None
        assert run.servers.slow_http is not None
        addresses = ["--address", run.servers.fast_http, "--slow-address", run.servers.slow_http]
        addresses += ["--protocol", run.protocol]
    return ["node", "dist/conformance/scenario.js", *addresses], ROOT / "clients" / "ts"


def indent(text: str) -> str:
    return "".join(f"    {line}\n" for line in text.strip().splitlines())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--clients", default="python,go,ts,a2a,examples", help="comma-separated subset"
    )
    parser.add_argument("--transports", default=",".join(TRANSPORTS), help="comma-separated subset")
    args = parser.parse_args(argv)
    clients = [c for c in args.clients.split(",") if c]
    wanted = [t for t in args.transports.split(",") if t]
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
        transports = make_transports(Path(scratch))
        started = time.monotonic()
        with live_servers(Path(scratch), [transports[name] for name in wanted]) as servers:
            shown = ", ".join(f"{p.transport.name} {p.fast} {p.slow}" for p in servers)
            print(f"servers up in {time.monotonic() - started:.1f}s: {shown}")
            for run in plan_runs(clients, servers):
                if run.client in broken:
                    failed += 1
                    continue
                command, cwd = scenario_command(run)
                outcome = run_bounded(command, cwd, SCENARIO_TIMEOUT, run.env())
                checks = sorted({a or b for a, b in FAILED_CHECK.findall(outcome.output)})
                if outcome.returncode == 0:
                    passed += 1
                    print(f"{run.label}: PASS ({outcome.seconds:.1f}s)")
                else:
                    failed += 1
                    why = ", ".join(checks) or f"exit {outcome.returncode}"
                    print(f"{run.label}: FAIL ({why}; {outcome.seconds:.1f}s)")
                    print(indent(outcome.output), end="")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
