"""The supervisor of `agio-grpc serve --workers N`: N worker processes serving one port.

The supervisor checks the listen address (a port in use fails at once, in one line), picks
the port when it is 0, and holds it: a socket bound with SO_REUSEPORT but never listening,
so its workers can bind the port beside it (grpc's `grpc.so_reuseport`) and no other
server can take it while the supervisor lives; the kernel spreads new connections over the
listening workers. It binds with SO_REUSEADDR too, so that the connections of a server just
stopped, left in TIME_WAIT, do not refuse a restart. Without OPENAI_BASE_URL it runs the
built-in fake model itself and gives its URL to every worker, so all of them answer alike.

Workers are fresh interpreters (`agio-grpc serve --worker I`, spawned, never forked), with
the supervisor's environment plus the chosen address. The first starts alone (it migrates
the store) and the others once it listens; a worker that fails to start the first time
stops the supervisor with exit code 2 (the worker has printed the one line saying why).
A worker that exits later is restarted in its slot after a backoff (0.5 s, doubling with
each start that fails in a row, at most 10 s; a worker that exits within `STABLE_AFTER_S`
of listening counts as a start that failed), and five failed starts in a row stop the
supervisor with exit code 2. SIGTERM or SIGINT is forwarded to every worker as SIGTERM; they
drain, and those still running after the grace period plus `KILL_MARGIN_S` are killed;
then the supervisor exits 0. SIGHUP is forwarded when the server speaks TLS (the workers
re-read its files).

Never imports grpc (directly or not): the supervisor holds no gRPC object when it spawns.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from agio_grpc.config import Settings
from agio_grpc.service.startup import cannot_listen, check_bindable, one_line
from agio_grpc.service.worker import READY
from agio_grpc.testing import FakeModelServer

log = logging.getLogger(__name__)

FIRST_RESTART_DELAY_S = 0.5
MAX_RESTART_DELAY_S = 10.0
MAX_FAILED_STARTS = 5
"""Starts of one slot that fail in a row before the supervisor gives up."""
STABLE_AFTER_S = 10.0
"""A worker that exits sooner than this after it listened counts as a start that failed."""
KILL_MARGIN_S = 5.0
"""Past the grace period, how long draining workers get to close their stores."""
STARTUP_FAILED = 2


@dataclass(slots=True)
class _Slot:
    """One worker's place: its current process, and how many starts failed in a row."""

    index: int
    process: asyncio.subprocess.Process | None = None
    failed_starts: int = 0
    ready_at: float = 0.0
    """When its worker last said it listens (the event loop's clock)."""
    channel: socket.socket | None = field(default=None, repr=False)


class Supervisor:
    """Spawns, restarts and drains the workers of one `serve --workers N`."""

    def __init__(self, settings: Settings, worker_command: Sequence[str]) -> None:
        self._settings = settings
        self._command = list(worker_command)
        self._slots = [_Slot(index) for index in range(1, settings.server.workers + 1)]
        self._stopping = asyncio.Event()
        self._exit_code = 0
        self._env: dict[str, str] = {}

    async def run(self) -> int:
        """Serve until SIGTERM or SIGINT; the exit code. Raises StartupError when the listen
        address cannot be had."""
        reserved, address = reserve_port(self._settings.listen_address)
        fake_model: FakeModelServer | None = None
        try:
            self._env = dict(os.environ) | {"AGIO_LISTEN_ADDRESS": address}
            if self._settings.openai_base_url is None:
                fake_model = FakeModelServer()
                await fake_model.start()
                self._env["OPENAI_BASE_URL"] = fake_model.base_url
            self._install_signal_handlers()
            if not await self._start_all():
                # The worker said why in one line; a stop asked for meanwhile is no failure.
                await self._drain([], quietly=True)
                return self._exit_code
            if fake_model is not None:
                log.warning(
                    "no OPENAI_BASE_URL set: using the built-in fake model at %s "
                    "(one for all the workers)",
                    fake_model.base_url,
                )
            log.info(
                "agio-grpc listening on %s with %d workers (pids %s)",
                address,
                len(self._slots),
                ", ".join(str(slot.process.pid) for slot in self._slots if slot.process),
            )
            keepers = [asyncio.create_task(self._keep(slot)) for slot in self._slots]
            await self._stopping.wait()
            await self._drain(keepers)
        finally:
            for sock in reserved:
                sock.close()
            if fake_model is not None:
                await fake_model.stop()
        log.info("stopped")
        return self._exit_code

    async def _start_all(self) -> bool:
        """The first worker alone (it migrates the store), then the others together."""
        first, *others = self._slots
        if not await self._start(first):
            return self._gave_up_at_first_start()
        started = await asyncio.gather(*(self._start(slot) for slot in others))
        return all(started) or self._gave_up_at_first_start()

    def _gave_up_at_first_start(self) -> bool:
        if not self._stopping.is_set():
            self._exit_code = STARTUP_FAILED
            self._stopping.set()
        return False

    async def _start(self, slot: _Slot, *, restart: bool = False) -> bool:
        """Spawn the slot's worker and wait until it listens (True) or exits (False)."""
        ours, theirs = socket.socketpair()
        try:
            slot.process = await asyncio.create_subprocess_exec(
                *self._command,
                "--worker",
                str(slot.index),
                "--supervisor-fd",
                str(theirs.fileno()),
                env=self._env,
                stdin=asyncio.subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
            )
        finally:
            theirs.close()
        if slot.channel is not None:
            slot.channel.close()
        slot.channel = ours  # held open while the worker lives: its end closing stops it
        log.log(
            logging.INFO if restart else logging.DEBUG,
            "worker %d %s (pid %d)",
            slot.index,
            "restarted" if restart else "started",
            slot.process.pid,
        )
        if self._stopping.is_set():
            slot.process.send_signal(signal.SIGTERM)
        ours.setblocking(False)
        try:
            said = await asyncio.get_running_loop().sock_recv(ours, len(READY))
        except OSError:
            said = b""
        if said == READY:
            slot.ready_at = asyncio.get_running_loop().time()
        return said == READY

    async def _keep(self, slot: _Slot) -> None:
        """Restart the slot's worker whenever it exits, until the supervisor stops."""
        loop = asyncio.get_running_loop()
        while True:
            assert slot.process is not None
            code = await slot.process.wait()
            if self._stopping.is_set():
                return
            # Gone within STABLE_AFTER_S of listening: a start that failed, as a crash loop.
            stable = loop.time() - slot.ready_at >= STABLE_AFTER_S
            slot.failed_starts = 0 if stable else slot.failed_starts + 1
            while slot.failed_starts < MAX_FAILED_STARTS:
                delay = min(FIRST_RESTART_DELAY_S * 2**slot.failed_starts, MAX_RESTART_DELAY_S)
                log.warning(
                    "worker %d (pid %d) %s: restarting it in %.1fs",
                    slot.index,
                    slot.process.pid,
                    _ended(code),
                    delay,
                )
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopping.wait(), delay)
                    return
                if await self._start(slot, restart=True):
                    break
                slot.failed_starts += 1
                code = await slot.process.wait()
            else:
                if not self._stopping.is_set():
                    log.error(
                        "worker %d failed to start %d times in a row (%s): stopping",
                        slot.index,
                        slot.failed_starts,
                        _ended(code),
                    )
                    self._exit_code = STARTUP_FAILED
                    self._stopping.set()
                return

    async def _drain(self, keepers: list[asyncio.Task[None]], *, quietly: bool = False) -> None:
        """SIGTERM to every worker; kill those still running after the grace period."""
        grace_s = self._settings.server.grace_period_s
        if not quietly:
            log.info("shutting down: draining the workers for up to %.1fs", grace_s)
        self._signal_workers(signal.SIGTERM)
        try:
            async with asyncio.timeout(grace_s + KILL_MARGIN_S):
                await self._all_exited(keepers)
        except TimeoutError:
            log.warning("workers still running after %.1fs: killing them", grace_s)
            self._signal_workers(signal.SIGKILL)
            await self._all_exited(keepers)
        for slot in self._slots:
            if slot.channel is not None:
                slot.channel.close()

    async def _all_exited(self, keepers: list[asyncio.Task[None]]) -> None:
        await asyncio.gather(*keepers)
        for slot in self._slots:
            if slot.process is not None:
                await slot.process.wait()

    def _stop(self) -> None:
        """Stop now, workers still starting included."""
        self._stopping.set()
        self._signal_workers(signal.SIGTERM)

    def _signal_workers(self, signum: int) -> None:
        for slot in self._slots:
            if slot.process is not None and slot.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    slot.process.send_signal(signum)

    def _install_signal_handlers(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._stop)
        if self._settings.tls_cert_file is not None:
            loop.add_signal_handler(signal.SIGHUP, self._signal_workers, signal.SIGHUP)


def _ended(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def reserve_port(address: str) -> tuple[list[socket.socket], str]:
    """Hold `address` for the workers: check it is free (raise StartupError if not), pick
    the port when it is 0, and bind a socket with SO_REUSEPORT to each of its addresses,
    never listening. Returns the sockets (to close on exit) and the address with its port."""
    check_bindable(address)
    host, _, port_text = address.rpartition(":")
    port = int(port_text)
    bare_host = host.removeprefix("[").removesuffix("]")
    try:
        resolved = socket.getaddrinfo(
            bare_host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as error:
        raise cannot_listen(address, f"the host does not resolve ({error})") from error
    held: list[socket.socket] = []
    for family, kind, protocol, _, socket_address in resolved:
        sock = socket.socket(family, kind, protocol)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            # The connections a stopped server left in TIME_WAIT must not refuse the bind
            # for a minute, as they do not refuse a lone server's (gRPC binds with it).
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((socket_address[0], port, *socket_address[2:]))
            # Off once bound: a bound socket with it on would let any server that sets it
            # bind and listen on the port while no worker listens (between restarts).
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)
        except OSError as error:
            sock.close()
            if not held:
                raise cannot_listen(address, one_line(error)) from error
            continue  # gRPC, too, listens when any of the addresses binds
        port = sock.getsockname()[1]
        held.append(sock)
    if not held:
        raise cannot_listen(address, "the host resolves to no address")
    return held, f"{host}:{port}"


def worker_command(debug: bool) -> list[str]:
    """How the supervisor starts a worker: this interpreter, `agio-grpc serve`."""
    return [sys.executable, "-m", "agio_grpc.cli", "serve", *(["--debug"] if debug else [])]
