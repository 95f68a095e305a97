"""`make fuzz`: the adversarial suite at length on SQLite and PostgreSQL at once.

One pytest process per backend (each is one event loop, busy with its own cases, so two
use two cores), with the `fuzz` hypothesis profile (tests/fuzz/profiles.py). Each one's
output, with its summary of cases and status codes, is printed once it ends. Fails when
either fails, or ran no tests (pytest's exit status 5 included). Extra arguments go to both
pytest runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from typing import IO

BACKENDS = ("sqlite", "postgres")


def main(extra: list[str]) -> int:
    env = {**os.environ, "AGIO_FUZZ_PROFILE": os.environ.get("AGIO_FUZZ_PROFILE") or "fuzz"}
    started = time.monotonic()
    runs: list[tuple[str, subprocess.Popen[bytes], IO[bytes]]] = []
    for backend in BACKENDS:
        log = tempfile.NamedTemporaryFile(prefix=f"agio-fuzz-{backend}-", suffix=".log")  # noqa: SIM115
        command = [sys.executable, "-m", "pytest", "tests/fuzz", "-p", "no:randomly", "-q"]
        command += ["-k", backend, *extra]
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        runs.append((backend, process, log))
    failed = 0
    for backend, process, log in runs:
        status = process.wait()
        with log:
            log.seek(0)
            sys.stdout.write(f"===== fuzz on {backend}: exit status {status} =====\n")
            sys.stdout.write(log.read().decode(errors="replace"))
        failed = failed or status
    minutes = (time.monotonic() - started) / 60
    print(f"fuzz: both backends in {minutes:.1f} min, {'FAILED' if failed else 'passed'}")
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
