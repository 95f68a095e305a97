"""One worker of `agio-grpc serve --workers N` (service/supervisor.py spawns them).

A worker is a full server, as a lone `serve` is, with four differences: it shares the
listen port with its siblings (SO_REUSEPORT; the supervisor checked the port and holds it),
its instance id is the server's plus `/worker-<index>` (stable across its restarts, so a
restarted worker ends the runs its predecessor left at once, and distinct from its live
siblings'), with debugging on every `agio.v1` response carries its process id in the
initial metadata `x-agio-worker`, and it talks to the supervisor over one end of a socket
pair: it writes
`ready` once it listens, and drains when the supervisor's end closes (the supervisor is
gone, even by SIGKILL: no worker outlives it).

Never imports grpc: the supervisor imports this module.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from dataclasses import dataclass

log = logging.getLogger(__name__)

WORKER_HEADER = "x-agio-worker"
"""Initial metadata of every `agio.v1` response of a worker debugging: its process id."""

READY = b"ready\n"
"""What a worker writes to the supervisor once it listens."""


@dataclass(frozen=True, slots=True)
class WorkerRole:
    """What makes a server one of the supervisor's workers."""

    index: int
    """1..N: the worker's slot, kept by its replacement."""
    supervisor_fd: int
    """The worker's end of its socket pair with the supervisor."""
    debug: bool = False
    """Debugging is on (`serve --debug`, or `log_level: DEBUG`): every response says which
    worker process answered. Off, no caller learns a process id."""

    def instance_id(self, server_instance_id: str) -> str:
        return f"{server_instance_id}/worker-{self.index}"

    def response_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((WORKER_HEADER, str(os.getpid())),) if self.debug else ()

    def name(self) -> str:
        """How the worker's log lines name it."""
        return f"worker {self.index} (pid {os.getpid()})"

    def report_ready(self) -> None:
        with socket.socket(fileno=os.dup(self.supervisor_fd)) as channel:
            channel.sendall(READY)

    def watch_supervisor(self, stop: asyncio.Event) -> None:
        """Set `stop` when the supervisor's end of the socket pair closes."""
        loop = asyncio.get_running_loop()
        channel = socket.socket(fileno=self.supervisor_fd)
        channel.setblocking(False)

        def readable() -> None:
            try:
                data = channel.recv(64)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                loop.remove_reader(channel.fileno())
                channel.close()
                if not stop.is_set():
                    log.warning("%s: the supervisor is gone; draining", self.name())
                    stop.set()

        loop.add_reader(channel.fileno(), readable)
