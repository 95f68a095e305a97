"""`make fuzz`: the adversarial suite at length on SQLite and PostgreSQL at once.

Each pytest process is one event loop busy with its own cases, so the properties are split
over five processes, about even in work (PostgreSQL's cases cost about twice SQLite's), for
the machine's cores to share: SQLite's; PostgreSQL's agent and undecodable requests; its
session requests; its request sequences and model streams; the A2A requests of both. Each runs the
`fuzz` hypothesis profile (tests/fuzz/profiles.py) with a server of its own; its output, with
its summary of cases and status codes, is printed once it ends, then the cases per backend.
Fails when any fails, or ran no tests (pytest's exit status 5 included). Extra arguments go to
every run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from typing import IO

GROUPS = (
    "sqlite and not a2a",
    "postgres and (agent_service or not_utf8)",
    "postgres and session_service",
    "postgres and (in_a_row or test_model_streams)",
    "a2a",
)
CASES_LINE = re.compile(r"^(sqlite|postgres): (\d+) cases", re.MULTILINE)


def main(extra: list[str]) -> int:
    env = {**os.environ, "AGIO_FUZZ_PROFILE": os.environ.get("AGIO_FUZZ_PROFILE") or "fuzz"}
    started = time.monotonic()
    runs: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []
    for group in GROUPS:
        log = tempfile.NamedTemporaryFile(prefix="agio-fuzz-", suffix=".log")  # noqa: SIM115
        command = [sys.executable, "-m", "pytest", "tests/fuzz", "-p", "no:randomly", "-q"]
        command += ["-k", group, *extra]
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        runs.append((group, process, log))
    failed = 0
    cases: dict[str, int] = {}
    for group, process, log in runs:
        status = process.wait()
        with log:
            log.seek(0)
            output = log.read().decode(errors="replace")
        sys.stdout.write(f"===== fuzz: {group}: exit status {status} =====\n{output}")
        for backend, count in CASES_LINE.findall(output):
            cases[backend] = cases.get(backend, 0) + int(count)
        failed = failed or status
    minutes = (time.monotonic() - started) / 60
    totals = ", ".join(f"{backend} {count:,} cases" for backend, count in cases.items())
    print(f"fuzz: {totals} in {minutes:.1f} min: {'FAILED' if failed else 'passed'}")
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
