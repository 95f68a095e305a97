"""Members: the servers sharing one database, calling each other.

Every server (each replica, each worker of `serve --workers N`) is a member. Besides its
public port it listens on its member address (`server.member_address`), a separate gRPC
server that takes calls from the other members only, and registers that address in the
store under its instance id (`MemberDirectory`). Two calls cross between members:

- `Follow`: a `WatchRun` sent to a member that does not run the run follows it live from
  the one that does: that member's `Runtime.follow_here` (its live channel, with the deltas
  of the step in progress), relayed as the `StepEvent`s it streams, under their seqs.
  `MemberCalls` is the engine's `RemoteRuns` port (engine/remote.py): `Runtime.follow`
  calls it, and each `StepEvent` goes to the engine as a `RelayedEvent` wrapping it as it
  came, never converted (the servicer writes it on). Should the call fail (that member
  died or is shutting down), the follow goes on from the journal after the last event
  relayed, where it sees the run end INTERRUPTED once the dead member's lease runs out.
- `CancelRequested`: a `CancelRun` sent elsewhere records its cancel request on the run
  (engine/leases.py), then tells the member running it, which acts on the request at once
  instead of at its next poll, and answers once the run has stopped.

Each call carries the members' shared token (a server secret in the store: every server of
the database reads the same one) in `x-agio-member-token`; a call without it is refused
UNAUTHENTICATED. Anything that goes wrong between members is logged and falls back to the
store (the journal, the polled cancel request): never the caller's error.
"""

from __future__ import annotations

import hmac
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
from google.protobuf import empty_pb2

from agio_grpc.engine.remote import RelayedEvent
from agio_grpc.engine.runtime import Runtime
from agio_grpc.service import convert
from agio_grpc.store.leases import MemberDirectory, SessionLeases
from agio_grpc.store.records import Member
from agio_grpc.v1 import agent_service_pb2 as pb
from agio_grpc.v1 import events_pb2

log = logging.getLogger(__name__)

SERVICE = "agio.internal.Members"
FOLLOW = f"/{SERVICE}/Follow"
CANCEL_REQUESTED = f"/{SERVICE}/CancelRequested"
TOKEN_HEADER = "x-agio-member-token"
TOKEN_SECRET = "member-token"
"""The name of the members' token among the store's server secrets."""
TERMINAL_EVENTS = frozenset({"run_completed", "run_failed"})
_CHANNEL_OPTIONS = [
    # A member that stops answering (not one that died: its socket closes at once) is found
    # out in seconds, and the watch goes on from the journal.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_receive_message_length", -1),
]
_SERVER_OPTIONS = [
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.max_send_message_length", -1),
]


def advertised_address(bound: str, configured: str) -> str:
    """The address the other members call: `configured`, else `bound` (the listener's
    `host:port`), with this host's name in place of a wildcard host."""
    if configured:
        return configured
    host, _, port = bound.rpartition(":")
    if host.strip("[]") in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    return f"{host}:{port}"


@dataclass(frozen=True, slots=True)
class _MemberStub:
    """The member calls on one channel to one member."""

    channel: grpc.aio.Channel
    follow: grpc.aio.UnaryStreamMultiCallable
    cancel_requested: grpc.aio.UnaryUnaryMultiCallable

    @classmethod
    def open(cls, address: str) -> _MemberStub:
        channel = grpc.aio.insecure_channel(address, options=_CHANNEL_OPTIONS)
        return cls(
            channel,
            channel.unary_stream(
                FOLLOW,
                request_serializer=pb.WatchRunRequest.SerializeToString,
                response_deserializer=events_pb2.StepEvent.FromString,
            ),
            channel.unary_unary(
                CANCEL_REQUESTED,
                request_serializer=pb.CancelRunRequest.SerializeToString,
                response_deserializer=empty_pb2.Empty.FromString,
            ),
        )


@dataclass
class MemberCalls:
    """This member's calls to the others (module docstring): the engine's `RemoteRuns`."""

    directory: MemberDirectory
    instance_id: str
    token: str
    _stubs: dict[str, _MemberStub] = field(default_factory=dict)

    async def close(self) -> None:
        stubs, self._stubs = self._stubs, {}
        for stub in stubs.values():
            await stub.channel.close()

    async def follow(self, run_id: str, after_seq: int) -> AsyncIterator[RelayedEvent]:
        """The run's events after `after_seq` as the member running it streams them, up to
        its next terminal event; nothing when it runs nowhere else. Ends early (the caller
        goes on from the journal) when that member cannot be followed to the end."""
        member = await self._elsewhere(run_id)
        if member is None:
            return
        request = pb.WatchRunRequest(run_id=run_id, after_seq=after_seq)
        stream = self._stub(member).follow(request, metadata=self._metadata())
        try:
            async for event in stream:
                terminal = event.WhichOneof("event") in TERMINAL_EVENTS
                yield RelayedEvent(event.seq, terminal, event)
        except grpc.aio.AioRpcError as error:
            log.info(
                "run %s: following it on member %s ended (%s): going on from the journal",
                run_id,
                member.instance_id,
                error.code().name,
            )
        finally:
            stream.cancel()

    async def tell_owner(self, run_id: str, timeout_s: float) -> None:
        """Tell the member running the run that a cancel request stands for it, and wait
        (up to `timeout_s`) for it to have stopped the run. Never raises."""
        try:
            member = await self._elsewhere(run_id)
            if member is None:
                return
            request = pb.CancelRunRequest(run_id=run_id)
            await self._stub(member).cancel_requested(
                request, timeout=max(timeout_s, 0.001), metadata=self._metadata()
            )
        except grpc.aio.AioRpcError as error:
            log.info(
                "run %s: could not reach the member running it (%s); it finds the cancel "
                "request at its next poll",
                run_id,
                error.code().name,
            )
        except Exception:
            log.exception("run %s: telling the member running it of a cancel failed", run_id)

    async def _elsewhere(self, run_id: str) -> Member | None:
        member = await self.directory.member_running(run_id)
        return member if member is not None and member.instance_id != self.instance_id else None

    def _stub(self, member: Member) -> _MemberStub:
        stub = self._stubs.get(member.address)
        if stub is None:
            stub = self._stubs[member.address] = _MemberStub.open(member.address)
        return stub

    def _metadata(self) -> tuple[tuple[str, str], ...]:
        return ((TOKEN_HEADER, self.token),)


@dataclass
class MemberListener:
    """This member's listener: the calls of the others (module docstring)."""

    runtime: Runtime
    leases: SessionLeases
    token: str
    address: str = ""
    """The address the others call, once started."""
    _server: grpc.aio.Server | None = None

    async def start(self, directory: MemberDirectory, bind: str, advertise: str = "") -> None:
        """Listen on `bind` and register in `directory` the address the others call."""
        server = grpc.aio.server(options=_SERVER_OPTIONS)
        server.add_generic_rpc_handlers([self._handlers()])
        port = server.add_insecure_port(bind)
        if port == 0:
            raise RuntimeError(f"could not bind {bind}")
        await server.start()
        self._server = server
        self.address = advertised_address(f"{bind.rpartition(':')[0]}:{port}", advertise)
        await directory.register_member(self.address)

    async def stop(self, grace_s: float = 0.0) -> None:
        """Stop listening; follows still open end (their callers go on from the journal)."""
        if self._server is not None:
            await self._server.stop(grace_s)

    def _handlers(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Follow": grpc.unary_stream_rpc_method_handler(
                    self._follow,
                    request_deserializer=pb.WatchRunRequest.FromString,
                    response_serializer=events_pb2.StepEvent.SerializeToString,
                ),
                "CancelRequested": grpc.unary_unary_rpc_method_handler(
                    self._cancel_requested,
                    request_deserializer=pb.CancelRunRequest.FromString,
                    response_serializer=empty_pb2.Empty.SerializeToString,
                ),
            },
        )

    async def _check_caller(self, context: grpc.aio.ServicerContext) -> None:
        given = dict(context.invocation_metadata() or ()).get(TOKEN_HEADER, "")
        if not isinstance(given, str) or not hmac.compare_digest(
            given.encode(), self.token.encode()
        ):
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, "not a member of this service")

    async def _follow(
        self, request: pb.WatchRunRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[events_pb2.StepEvent]:
        await self._check_caller(context)
        try:
            async for event in self.runtime.follow_here(request.run_id, request.after_seq):
                yield convert.event_to_proto(event)
        except Exception as error:  # the caller goes on from the journal
            log.info("run %s: a member's follow of it ended: %r", request.run_id, error)
            await context.abort(grpc.StatusCode.UNAVAILABLE, "cannot follow the run here")

    async def _cancel_requested(
        self, request: pb.CancelRunRequest, context: grpc.aio.ServicerContext
    ) -> empty_pb2.Empty:
        await self._check_caller(context)
        requested = await self.leases.cancel_requests([request.run_id])
        signal = requested.get(request.run_id)
        if signal is not None:
            await self.runtime.stop(request.run_id, signal)
        return empty_pb2.Empty()
