"""The gRPC method handlers served over the Connect protocol and gRPC-Web.

No RPC is written twice. Each HTTP call is handed to the very method handler the gRPC server
runs (the servicer's method wrapped by the same interceptors: tracing, authentication,
admission and error mapping) with a `ConnectCall` standing in for grpc's ServicerContext. The
connectrpc library speaks the wire (Connect unary and streaming, JSON and binary, gRPC-Web;
timeouts, envelopes, compression, the error body); this module only:

- collects the handlers that the generated `add_*_to_server` functions register
  (`HandlerTable`);
- resolves a call's handler through the interceptor chain, as grpc.aio does, with the HTTP
  headers as the call's metadata (`authorization`, `traceparent` reach the same code);
- decodes the request inside that chain: binary bytes with the handler's own deserializer,
  JSON with json_format, an unparsable body standing in as `Undecodable`, so that both end
  as INVALID_ARGUMENT `MALFORMED_REQUEST` after authentication, exactly as on gRPC;
- relays what a streaming handler writes, and turns the status a handler aborts with into a
  ConnectError carrying the same `google.rpc` details (ErrorInfo, BadRequest, ...);
- serves bidirectional streams written as async generators over a request iterator (server
  reflection's), which need HTTP/2.

It never imports a servicer: it serves whatever handlers it is given, and never answers a
call itself except when the handler chain fails in a way no status describes (INTERNAL,
logged with its traceback, the caller told nothing more).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, NoReturn, cast

import grpc
from connectrpc.code import Code
from connectrpc.errors import ConnectError, ErrorDetail
from connectrpc.method import IdempotencyLevel, MethodInfo, StreamType
from connectrpc.request import Headers, RequestContext
from connectrpc.server import ConnectASGIApplication, Endpoint
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import Message
from google.rpc import status_pb2
from protobuf.wkt import Any as WireAny

from agio_grpc.handlers import AGIO_METHODS
from agio_grpc.service.errors import internal_error, malformed_request, to_status
from agio_grpc.service.interceptors import Undecodable

log = logging.getLogger(__name__)

STATUS_DETAILS_KEY = "grpc-status-details-bin"
OUTBOX_MESSAGES = 16
"""How many written messages a streaming handler may be ahead of the HTTP response: past
that its `write` waits, as a gRPC write waits for flow control."""

_NOT_METADATA = frozenset(
    {
        "accept",
        "accept-encoding",
        "connection",
        "content-encoding",
        "content-length",
        "content-type",
        "host",
        "keep-alive",
        "te",
        "transfer-encoding",
        "upgrade",
        "x-grpc-web",
        "x-user-agent",
    }
)
"""Request headers that belong to HTTP or the wire protocol, not to the call's metadata."""

Metadata = tuple[tuple[str, str], ...]
ServedEndpoint = Any
"""A unary or server-streaming connectrpc endpoint (their classes are not exported)."""


class _CallDetails(NamedTuple):
    """What an interceptor learns of a call before its request: grpc.HandlerCallDetails."""

    method: str
    invocation_metadata: Metadata


@dataclass(frozen=True, slots=True)
class WireRequest:
    """A request as it came off the wire, decoded only once its handler is known."""

    data: bytes
    json: bool


class DeferredCodec:
    """A connectrpc codec that hands the request's bytes on undecoded (they are decoded
    inside the handler chain, after authentication) and encodes google.protobuf
    responses."""

    def __init__(self, *, json: bool) -> None:
        self._json = json

    def name(self) -> str:
        return "json" if self._json else "proto"

    def encode(self, message: Message) -> bytes:
        if self._json:
            return json_format.MessageToJson(message, indent=None).encode()
        return message.SerializeToString()

    def decode(self, data: bytes | bytearray, message_class: type[Any]) -> WireRequest:
        return WireRequest(bytes(data), self._json)


class HandlerTable:
    """The method handlers that generated `add_*_to_server` functions register, found by
    path (`/agio.v1.AgentService/Run`); it stands in for the grpc server they expect."""

    def __init__(self) -> None:
        self._registered: dict[str, grpc.RpcMethodHandler] = {}
        self._generic: list[grpc.GenericRpcHandler] = []

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        for name, handler in handlers.items():
            self._registered[f"/{service}/{name}"] = handler

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._generic.extend(handlers)

    def find(self, details: _CallDetails) -> grpc.RpcMethodHandler | None:
        handler = self._registered.get(details.method)
        if handler is not None:
            return handler
        for generic in self._generic:
            found = generic.service(details)
            if found is not None:
                return found
        return None


class CallAborted(grpc.aio.AbortError):  # type: ignore[misc]
    """The status a handler ended its call with (what grpc's `abort` raises)."""


class ConnectCall(grpc.aio.ServicerContext):  # type: ignore[misc]
    """grpc's ServicerContext for one Connect or gRPC-Web call: metadata from the request's
    headers, the deadline from its timeout, writes relayed to the HTTP response, and the
    status it is aborted with kept for the response."""

    def __init__(self, context: RequestContext[Any, Any], metadata: Metadata) -> None:
        self._context = context
        self._metadata = metadata
        self._outbox: asyncio.Queue[Message | None] = asyncio.Queue()
        self._room = asyncio.Semaphore(OUTBOX_MESSAGES)
        self._code: grpc.StatusCode | None = None
        self._details: str | None = None
        self._trailing: Metadata = ()
        self._over = False

    # -- what the handlers use ------------------------------------------------------------

    async def read(self) -> NoReturn:
        raise RuntimeError("the methods served over HTTP take one request: nothing to read")

    async def write(self, message: Message) -> None:
        await self._room.acquire()
        self._outbox.put_nowait(message)

    async def send_initial_metadata(self, initial_metadata: Sequence[tuple[str, Any]]) -> None:
        for key, value in initial_metadata:
            self._context.response_headers.add(key, str(value))

    async def abort(
        self,
        code: grpc.StatusCode,
        details: str = "",
        trailing_metadata: Sequence[tuple[str, Any]] = (),
    ) -> NoReturn:
        self._code = code
        self._details = details
        self._trailing = tuple(trailing_metadata)
        raise CallAborted()

    async def abort_with_status(self, status: grpc.Status) -> NoReturn:
        await self.abort(status.code, status.details, status.trailing_metadata)

    def set_trailing_metadata(self, trailing_metadata: Sequence[tuple[str, Any]]) -> None:
        self._trailing = tuple(trailing_metadata)

    def trailing_metadata(self) -> Metadata:
        return self._trailing

    def invocation_metadata(self) -> Metadata:
        return self._metadata

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def details(self) -> str | None:
        return self._details

    def set_compression(self, compression: grpc.Compression) -> None:
        """Nothing to do: connectrpc picks the response's compression from the request's
        `accept-encoding` (or `connect-accept-encoding`, `grpc-accept-encoding`)."""

    def disable_next_message_compression(self) -> None:
        """Nothing to do, as for `set_compression`."""

    def peer(self) -> str:
        return f"http:{self._context.client_address or 'unknown'}"

    def peer_identities(self) -> None:
        """None: the HTTP listener has no TLS peer (a client certificate never reaches it)."""
        return None

    def peer_identity_key(self) -> None:
        return None

    def auth_context(self) -> dict[str, list[bytes]]:
        """Empty, as for `peer_identities`."""
        return {}

    def time_remaining(self) -> float | None:
        remaining_ms = self._context.timeout_ms
        return None if remaining_ms is None else max(remaining_ms / 1000, 0.0)

    def done(self) -> bool:
        return self._over

    def cancelled(self) -> bool:
        return self._over and self._code is None

    # -- what the adapter uses ------------------------------------------------------------

    def end_writes(self, _: object = None) -> None:
        """No message follows (the handler returned or failed)."""
        self._outbox.put_nowait(None)

    async def next_message(self) -> Message | None:
        """The next message the handler wrote; None once it is done writing."""
        message = await self._outbox.get()
        if message is not None:
            self._room.release()
        return message

    def close(self) -> None:
        self._over = True

    def aborted_error(self) -> ConnectError:
        """The ConnectError of the status the handler aborted with; trailing metadata other
        than the status details goes out as the response's trailers."""
        error, rest = connect_error(self._code, self._details or "", self._trailing)
        for key, value in rest:
            self._context.response_trailers.add(key, value)
        return error


def connect_error(
    code: grpc.StatusCode | None, message: str, trailing_metadata: Sequence[tuple[str, Any]]
) -> tuple[ConnectError, Metadata]:
    """The ConnectError of a gRPC status: the same code and message, the same `google.rpc`
    details (ErrorInfo, BadRequest, ...); and the status's other text metadata."""
    details: list[ErrorDetail] = []
    rest: list[tuple[str, str]] = []
    for key, value in trailing_metadata:
        if key == STATUS_DETAILS_KEY and isinstance(value, bytes):
            status = status_pb2.Status.FromString(value)
            details.extend(
                ErrorDetail(WireAny(type_url=detail.type_url, value=detail.value))
                for detail in status.details
            )
        elif isinstance(value, str):
            rest.append((key, value))
    return ConnectError(_connect_code(code), message, details), tuple(rest)


def _connect_code(code: grpc.StatusCode | None) -> Code:
    if code is None or code is grpc.StatusCode.OK:
        return Code.UNKNOWN  # aborted with no error code: a handler's mistake
    if code is grpc.StatusCode.CANCELLED:
        return Code.CANCELED
    return Code[code.name]


def status_error(status: grpc.Status) -> ConnectError:
    """The ConnectError of a status built by `errors.to_status` outside any handler."""
    return connect_error(status.code, status.details, status.trailing_metadata)[0]


def call_metadata(headers: Headers) -> Metadata:
    """The call's metadata: its request headers less those of HTTP and the wire protocol."""
    return tuple(
        (key.lower(), value)
        for key, value in headers.allitems()
        if key.lower() not in _NOT_METADATA and not key.lower().startswith(("connect-", "grpc-"))
    )


class ConnectGateway:
    """The Connect endpoints of the methods of `services`, each served by the handler
    `table` holds for it, wrapped by `interceptors` (first outermost, as on the gRPC
    server)."""

    def __init__(
        self,
        table: HandlerTable,
        interceptors: Sequence[grpc.aio.ServerInterceptor],
        services: Sequence[ServiceDescriptor],
    ) -> None:
        self._table = table
        self._interceptors = tuple(interceptors)
        self._services = tuple(services)

    def endpoints(self) -> dict[str, ServedEndpoint]:
        found: dict[str, ServedEndpoint] = {}
        for service in self._services:
            for method in service.methods:
                if method.client_streaming and not method.server_streaming:
                    raise ValueError(f"{method.full_name}: client streaming is not served")
                path = f"/{service.full_name}/{method.name}"
                info: MethodInfo[Any, Any] = MethodInfo(
                    name=method.name,
                    service_name=service.full_name,
                    input=message_factory.GetMessageClass(method.input_type),
                    output=message_factory.GetMessageClass(method.output_type),
                    idempotency_level=IdempotencyLevel.UNKNOWN,
                    stream_type=(
                        StreamType.BIDI_STREAM
                        if method.client_streaming
                        else StreamType.SERVER_STREAM
                        if method.server_streaming
                        else StreamType.UNARY
                    ),
                )
                if method.client_streaming:
                    found[path] = Endpoint.bidi_stream(
                        info, functools.partial(self._bidi, path, info.input)
                    )
                elif method.server_streaming:
                    found[path] = Endpoint.server_stream(
                        info, functools.partial(self._stream, path, info.input)
                    )
                else:
                    found[path] = Endpoint.unary(
                        info, functools.partial(self._unary, path, info.input)
                    )
        return found

    async def _resolve(self, path: str, metadata: Metadata) -> grpc.RpcMethodHandler:
        """The call's handler as the interceptors make it, as grpc.aio resolves it."""

        async def registered(details: _CallDetails) -> grpc.RpcMethodHandler:
            return self._table.find(details)

        continuation: Callable[[_CallDetails], Awaitable[grpc.RpcMethodHandler]] = registered
        for interceptor in reversed(self._interceptors):
            continuation = functools.partial(interceptor.intercept_service, continuation)
        handler = await continuation(_CallDetails(path, metadata))
        if handler is None:
            raise ConnectError(Code.UNIMPLEMENTED, f"{path} is not served here")
        return handler

    async def _unary(
        self,
        path: str,
        message_class: type[Message],
        wire: WireRequest,
        context: RequestContext[Any, Any],
    ) -> Message:
        call = ConnectCall(context, call_metadata(context.request_headers))
        try:
            handler = await self._resolve(path, call.invocation_metadata())
            request = _decode(path, handler, wire, message_class)
            response: Message = await handler.unary_unary(request, call)
            return response
        except BaseException as error:
            raise _connect_error(error, call) from None
        finally:
            call.close()

    async def _stream(
        self,
        path: str,
        message_class: type[Message],
        wire: WireRequest,
        context: RequestContext[Any, Any],
    ) -> AsyncIterator[Message]:
        call = ConnectCall(context, call_metadata(context.request_headers))
        try:
            handler = await self._resolve(path, call.invocation_metadata())
            request = _decode(path, handler, wire, message_class)
        except BaseException as error:
            raise _connect_error(error, call) from None
        # The handler runs in its own task, as on gRPC: a caller that leaves cancels it
        # there, and its cleanup (ending the run it owns) runs before the response ends.
        task = asyncio.create_task(_write_all(handler.unary_stream, request, call))
        task.add_done_callback(call.end_writes)
        try:
            while (message := await call.next_message()) is not None:
                yield message
            await task
        except BaseException as error:
            raise _connect_error(error, call) from None
        finally:
            call.close()
            if not task.done():
                task.cancel()
            # The handler's cleanup goes to its end; its outcome is the response's already.
            await asyncio.wait([task])
            if not task.cancelled():
                task.exception()

    async def _bidi(
        self,
        path: str,
        message_class: type[Message],
        wires: AsyncIterator[WireRequest],
        context: RequestContext[Any, Any],
    ) -> AsyncIterator[Message]:
        """A bidirectional stream whose handler is an async generator over its requests (as
        server reflection's is): each response goes out as it is made."""
        call = ConnectCall(context, call_metadata(context.request_headers))
        try:
            handler = await self._resolve(path, call.invocation_metadata())
            requests = (_decode(path, handler, wire, message_class) async for wire in wires)
            async for message in handler.stream_stream(requests, call):
                yield message
        except BaseException as error:
            raise _connect_error(error, call) from None
        finally:
            call.close()


async def _write_all(
    behavior: Callable[[Any, ConnectCall], Any], request: Any, call: ConnectCall
) -> None:
    """Run a streaming handler: written with `context.write` (as the service's are) or as
    an async generator."""
    result = behavior(request, call)
    if inspect.isasyncgen(result):
        async for message in result:
            await call.write(cast(Message, message))
    else:
        await result


def _decode(
    path: str, handler: grpc.RpcMethodHandler, wire: WireRequest, message_class: type[Message]
) -> Any:
    """The request the handler takes. A body that does not decode reaches an `agio.v1`
    handler as it does on gRPC: as `Undecodable` (what the error interceptor's deserializer
    makes of bad bytes), which its guard refuses after authentication."""
    try:
        if not wire.json:
            return handler.request_deserializer(wire.data)
        return json_format.Parse(wire.data, message_class(), ignore_unknown_fields=True)
    except Exception as error:  # not JSON, not UTF-8, not the message, nested too deep
        if path.startswith(AGIO_METHODS):
            return Undecodable(type(error).__name__)
        # Health checking has no error interceptor to refuse it: refused here.
        raise status_error(to_status(malformed_request(path))) from None


def _connect_error(error: BaseException, call: ConnectCall) -> BaseException:
    """What the HTTP response reports for what ended a call's handler."""
    if isinstance(error, ConnectError):
        return error
    if isinstance(error, CallAborted):
        return call.aborted_error()
    if isinstance(error, asyncio.CancelledError):
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            return error  # this request is being cancelled (its client left, its deadline)
        # The handler gave up on a call it saw was over (abort_call): nothing to add.
        return ConnectError(Code.CANCELED, "the call ended before its status was sent")
    if isinstance(error, Exception):
        log.error("unhandled error serving a call over HTTP", exc_info=error)
        return status_error(to_status(internal_error()))
    return error


class ConnectApplication(ConnectASGIApplication[ConnectGateway]):
    """The ASGI application of a gateway's endpoints, with requests up to `read_max_bytes`."""

    def __init__(self, gateway: ConnectGateway, *, read_max_bytes: int) -> None:
        super().__init__(
            service=gateway,
            endpoints=ConnectGateway.endpoints,
            read_max_bytes=read_max_bytes,
            codecs=[DeferredCodec(json=False), DeferredCodec(json=True)],
        )

    @property
    def path(self) -> str:
        return "/"
