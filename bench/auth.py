"""What authentication and TLS cost a run: B1 time to first token, three ways.

    python -m bench.auth                 # 300 runs a path, 50 one-word chunks each
    python -m bench.auth --runs 1000

Paths, each a `Run` to its terminal event against its own `agio-grpc serve` (a fresh SQLite
file) on one shared fake model:

- none, plaintext: `AGIO_AUTH=none`, no TLS (the baseline);
- api_key, plaintext: an API key made with `agio-grpc keys create`, checked on every call;
- api_key over TLS: the same, on a TLS port (a CA made for the run).

Runs alternate between the paths, so drift in the machine's load hits all three; each
client keeps its connection (TLS is negotiated once, as a client does). The target: the
api_key path adds at most 0.3 ms to the baseline's p50.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from agio_grpc.client import AgioClient, TlsConfig
from agio_grpc.testing.certificates import CertificateAuthority
from bench import procs
from bench.stats import median, percentile
from bench.streaming import Samples, service_run, ttft_main

PATHS = ("none, plaintext", "api_key, plaintext", "api_key over TLS")


def make_key(database_url: str) -> str:
    """A key made as an operator makes one: the last line `agio-grpc keys create` prints."""
    made = subprocess.run(
        [*procs.CLI, "keys", "create", "--tenant", "bench"],
        env=procs.clean_env() | {"AGIO_DATABASE_URL": database_url},
        capture_output=True,
        text=True,
        check=True,
    )
    return made.stdout.splitlines()[-1]


async def measure(runs: int, tokens: int, warmup: int) -> dict[str, Samples]:
    samples = {path: Samples() for path in PATHS}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        ca = CertificateAuthority("bench CA")
        ca_file = ca.write(folder)
        cert, key = ca.issue_server().write(folder, "server")
        tls_env = {"AGIO_TLS_CERT_FILE": str(cert), "AGIO_TLS_KEY_FILE": str(key)}
        databases = {
            path: f"sqlite+aiosqlite:///{folder / f'{n}.db'}" for n, path in enumerate(PATHS)
        }
        tokens_by_path = {path: make_key(databases[path]) for path in PATHS[1:]}
        envs = {
            PATHS[0]: {"AGIO_AUTH": "none"},
            PATHS[1]: {"AGIO_AUTH": "api_key"},
            PATHS[2]: {"AGIO_AUTH": "api_key"} | tls_env,
        }
        async with (
            procs.fake_model(tokens) as model,  # entered first: the servers need its address
            procs.agio_server(model.ready, databases[PATHS[0]], envs[PATHS[0]]) as plain,
            procs.agio_server(model.ready, databases[PATHS[1]], envs[PATHS[1]]) as keyed,
            procs.agio_server(model.ready, databases[PATHS[2]], envs[PATHS[2]]) as secure,
        ):
            clients = {
                PATHS[0]: AgioClient(plain.ready),
                PATHS[1]: AgioClient(keyed.ready, token=tokens_by_path[PATHS[1]]),
                PATHS[2]: AgioClient(
                    secure.ready,
                    token=tokens_by_path[PATHS[2]],
                    tls=TlsConfig(ca_file=ca_file),
                ),
            }
            try:
                for index in range(warmup + runs):
                    for path, client in clients.items():
                        target = samples[path] if index >= warmup else Samples()
                        await service_run(client, target, tokens)
            finally:
                for client in clients.values():
                    await client.close()
    return samples


def table(samples: dict[str, Samples]) -> str:
    base = median(samples[PATHS[0]].ttft_ms)
    lines = [
        "| path | TTFT p50 (ms) | p90 (ms) | p50 over none, plaintext (ms) |",
        "|---|---|---|---|",
    ]
    for path, measured in samples.items():
        p50 = median(measured.ttft_ms)
        p90 = percentile(measured.ttft_ms, 90)
        lines.append(f"| {path} | {p50:.2f} | {p90:.2f} | {p50 - base:+.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return ttft_main(__doc__.splitlines()[0], measure, table, argv)


if __name__ == "__main__":
    sys.exit(main())
