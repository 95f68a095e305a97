"""A typed async Python client for agio-grpc.

Wraps the generated stubs: run streams as async iterators of `StepEvent`, a convenience
that runs to the end and returns the final text and StopSignal, auto-paging step listing,
and errors decoded into `AgioError` with the `google.rpc.ErrorInfo` reason. Every call
carries the caller's current OpenTelemetry trace context (`traceparent`), so a run joins
the caller's trace, and the client's credential (`token`) if it has one.

    async with AgioClient("127.0.0.1:50051") as client:
        result = await client.run_to_end("What is 12 * 7?")
        print(result.text, result.stop_signal.reason)

A run whose answer must be JSON of a schema (a pydantic model, or a JSON Schema mapping):

        result = await client.run_to_end("Paris?", output_schema=City)
        city = result.output  # a City, or None when the run ended without a valid answer

Over TLS, with a token (mutual TLS: the client's certificate and key as well):

    tls = TlsConfig(ca_file="ca.pem", cert_file="client.pem", key_file="client.key")
    async with AgioClient("agio.internal:50051", tls=tls, token=token) as client: ...
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import json
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import grpc
from google.protobuf import json_format
from google.rpc import error_details_pb2, status_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import BaseModel

from agio_grpc.telemetry.propagation import trace_metadata
from agio_grpc.v1 import (
    agent_service_pb2,
    agent_service_pb2_grpc,
    events_pb2,
    resources_pb2,
    session_service_pb2,
    session_service_pb2_grpc,
)

StepEvent = events_pb2.StepEvent
_STATUS_DETAILS_KEY = "grpc-status-details-bin"


class TlsFailure(enum.Enum):
    """Why the client could not connect, when it failed in or around the TLS handshake
    (read from gRPC's message: no call reached the server)."""

    SERVER_WANTS_TLS = "the server may speak TLS"
    """A plaintext client whose connection the server closed at once."""
    UNTRUSTED_CERTIFICATE = "the server's certificate is not signed by a CA the client trusts"
    SERVER_WITHOUT_TLS = "the server speaks plaintext"
    """A TLS client that got no TLS answer."""
    HANDSHAKE_REFUSED = "the server refused the TLS handshake"
    """A TLS client whose connection the server closed in the handshake: most often a mutual
    TLS server and a client without a certificate its CA signed."""


TLS_HINTS = {
    TlsFailure.SERVER_WANTS_TLS: "connect with tls=TlsConfig(ca_file=...) naming the CA that "
    "signed its certificate (tls=True for a public CA)",
    TlsFailure.UNTRUSTED_CERTIFICATE: "name the CA that signed it in TlsConfig(ca_file=...)",
    TlsFailure.SERVER_WITHOUT_TLS: "connect without tls",
    TlsFailure.HANDSHAKE_REFUSED: "with mutual TLS it wants a client certificate a CA it "
    "accepts signed: TlsConfig(cert_file=..., key_file=...), and ca_file for the server's CA",
}
"""What to change in the client for each TlsFailure (the CLI says it with its options)."""


@dataclass(slots=True)
class AgioError(Exception):
    """A call that failed, with its status and the server's stable `reason`."""

    code: grpc.StatusCode
    message: str
    reason: str = ""
    domain: str = ""
    """The ErrorInfo domain (`agio-grpc` for errors raised by the service)."""
    metadata: dict[str, str] = field(default_factory=dict)
    field_violations: list[tuple[str, str]] = field(default_factory=list)
    tls_failure: TlsFailure | None = None
    """Set when the connection failed in the TLS handshake (or, plaintext, looks as if the
    server wanted one): `__str__` then says what to change."""

    def __str__(self) -> str:
        reason = f" [{self.reason}]" if self.reason else ""
        text = f"{self.code.name}{reason}: {self.message}"
        if self.tls_failure is not None:
            text += f" ({self.tls_failure.value}: {TLS_HINTS[self.tls_failure]})"
        return text


def tls_failure(code: grpc.StatusCode, message: str, tls: bool | None) -> TlsFailure | None:
    """The TlsFailure a failed connection's status says, if any. `tls`: whether the channel
    speaks TLS (None: unknown, a channel the caller made)."""
    # Only failures to connect (gRPC's round robin and pick-first say so each its way): a
    # connection that broke later says nothing about TLS.
    connecting = "all backends failing" in message or "failed to connect to all" in message
    if code is not grpc.StatusCode.UNAVAILABLE or not connecting:
        return None
    if "CERTIFICATE_VERIFY_FAILED" in message:
        return TlsFailure.UNTRUSTED_CERTIFICATE
    if "WRONG_VERSION_NUMBER" in message:
        return TlsFailure.SERVER_WITHOUT_TLS
    if "Socket closed" in message or "handshake failed" in message.lower():
        if tls is None:
            return None
        return TlsFailure.HANDSHAKE_REFUSED if tls else TlsFailure.SERVER_WANTS_TLS
    return None


def decode_error(error: grpc.aio.AioRpcError, *, tls: bool | None = None) -> AgioError:
    """The AgioError for a failed call, with ErrorInfo and BadRequest details when sent, and
    the TlsFailure of a connection that failed in its handshake (`tls`: whether the channel
    speaks TLS; None: unknown)."""
    message = error.details() or ""
    decoded = AgioError(
        code=error.code(), message=message, tls_failure=tls_failure(error.code(), message, tls)
    )
    for key, value in error.trailing_metadata() or ():
        if key != _STATUS_DETAILS_KEY or not isinstance(value, bytes):
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                decoded.reason = info.reason
                decoded.domain = info.domain
                decoded.metadata = dict(info.metadata)
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                decoded.field_violations = [(v.field, v.description) for v in bad.field_violations]
    return decoded


@dataclass(slots=True)
class RunResult:
    """What a whole run produced, collected by `AgioClient.run_to_end`."""

    run: resources_pb2.Run
    text: str
    steps: list[resources_pb2.Step]
    events: int
    output: Any = None
    """A run with an output schema that completed: its answer (`Run.output`) as Python
    values (JSON numbers without a fraction as `int`), or an instance of the pydantic model
    given as `output_schema`; None otherwise."""

    @property
    def stop_signal(self) -> resources_pb2.StopSignal:
        return self.run.stop_signal

    @property
    def session_id(self) -> str:
        return self.run.session_id


def _tool_definitions(
    tools: Iterable[resources_pb2.ToolDefinition | Mapping[str, str]],
) -> list[resources_pb2.ToolDefinition]:
    return [
        tool
        if isinstance(tool, resources_pb2.ToolDefinition)
        else resources_pb2.ToolDefinition(
            name=tool["name"],
            description=tool.get("description", ""),
            parameters_json=tool.get("parameters_json", ""),
        )
        for tool in tools
    ]


OutputSchema = Mapping[str, Any] | str | type[BaseModel]
"""A run's output schema: a JSON Schema (a mapping, or JSON text) or a pydantic model class
(its `model_json_schema()`)."""


def output_schema_json(schema: OutputSchema | None) -> str:
    """`RunRequest.output_schema_json` for `schema` ("" for none)."""
    if schema is None:
        return ""
    if isinstance(schema, str):
        return schema
    if isinstance(schema, type):
        return json.dumps(schema.model_json_schema())
    return json.dumps(dict(schema))


def output_value(run: resources_pb2.Run) -> Any:
    """The run's output as Python values (None when it has none); a JSON number without a
    fraction is an `int`, as it was in the answer (`google.protobuf.Value` holds doubles)."""
    if not run.HasField("output"):
        return None
    return _whole_numbers(json_format.MessageToDict(run.output))


_EXACT_INTEGERS = 2**53


def _whole_numbers(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) <= _EXACT_INTEGERS:
        return int(value)
    if isinstance(value, dict):
        return {key: _whole_numbers(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_whole_numbers(item) for item in value]
    return value


def _run_request(
    input: str,
    *,
    session_id: str,
    agent: str,
    overrides: agent_service_pb2.RunOverrides | None,
    client_tools: Iterable[resources_pb2.ToolDefinition | Mapping[str, str]],
    request_id: str,
    metadata: Mapping[str, str] | None,
    on_busy: agent_service_pb2.BusyPolicy,
    on_disconnect: agent_service_pb2.DisconnectPolicy = (
        agent_service_pb2.DISCONNECT_POLICY_UNSPECIFIED
    ),
    output_schema: OutputSchema | None = None,
    require_approval: Iterable[str] = (),
) -> agent_service_pb2.RunRequest:
    return agent_service_pb2.RunRequest(
        session_id=session_id,
        agent=agent,
        input=input,
        overrides=overrides,
        client_tools=_tool_definitions(client_tools),
        request_id=request_id,
        metadata=dict(metadata or {}),
        on_busy=on_busy,
        on_disconnect=on_disconnect,
        output_schema_json=output_schema_json(output_schema),
        require_approval=list(require_approval),
    )


class TlsFileError(ValueError):
    """A TLS file of the client that cannot be used (unreadable, or a certificate without
    its key)."""


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """How the client reaches the server over TLS."""

    ca_file: str | Path | None = None
    """PEM certificates of the CAs that signed the server's certificate; None: gRPC's
    default roots (GRPC_DEFAULT_SSL_ROOTS_FILE_PATH, else the ones grpcio ships)."""
    cert_file: str | Path | None = None
    """The client's PEM certificate chain, for a server that asks for one (mutual TLS)."""
    key_file: str | Path | None = None
    """The PEM private key of `cert_file`."""

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Read the files; raises TlsFileError."""
        if (self.cert_file is None) != (self.key_file is None):
            raise TlsFileError("a client certificate goes with its key: give both or neither")
        return grpc.ssl_channel_credentials(
            root_certificates=_read_tls_file(self.ca_file, "CA"),
            private_key=_read_tls_file(self.key_file, "key"),
            certificate_chain=_read_tls_file(self.cert_file, "certificate"),
        )


def _read_tls_file(path: str | Path | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise TlsFileError(f"cannot read the {what} file {path}: {error.strerror}") from None


class AddressError(ValueError):
    """Server addresses that make no gRPC target."""


ROUND_ROBIN = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})
"""The channel's service config: calls spread over every address the target names (or a
DNS name resolves to), one after the other, skipping those not connected."""

_SCHEMES = ("dns:", "ipv4:", "ipv6:", "unix:", "unix-abstract:", "vsock:", "xds:")
"""gRPC target schemes, whose targets are passed to gRPC as they are."""


def channel_target(address: str | Sequence[str]) -> str:
    """The gRPC target for one address (`host:port`, or a target with its scheme such as
    `dns:///agio.internal:50051`), or for several `host:port` given as a list or as one
    comma-separated string (`AGIO_ADDRESS`): IP addresses of one family, which become one
    `ipv4:` or `ipv6:` target (several host names: use one DNS name that resolves to all)."""
    if isinstance(address, str):
        if address.startswith(_SCHEMES):
            return address
        address = address.split(",")
    parts = [part.strip() for part in address if part.strip()]
    if not parts:
        raise AddressError("no server address given")
    if len(parts) == 1:
        return parts[0]
    families = {_ip_family(part) for part in parts}
    if len(families) != 1 or None in families:
        raise AddressError(
            f"several addresses must be IP addresses of one family ({', '.join(parts)}); "
            "for host names, give one dns:///NAME:PORT that resolves to them all"
        )
    return f"{families.pop()}:{','.join(parts)}"


def _ip_family(address: str) -> str | None:
    """`ipv4` or `ipv6` for `IP:PORT` (`[IPv6]:PORT`), else None."""
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return None
    try:
        ip = ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return None
    if ip.version == 6 and not host.startswith("["):
        return None
    return f"ipv{ip.version}"


def open_channel(target: str | Sequence[str], tls: TlsConfig | bool = False) -> grpc.aio.Channel:
    """A channel to `target` (see `channel_target`) balancing calls round robin over its
    addresses: plaintext, or TLS (`True`: with gRPC's default roots). Each channel has
    connections of its own: two channels to one address are two connections."""
    options: list[tuple[str, str | int]] = [
        ("grpc.service_config", ROUND_ROBIN),
        # gRPC shares one connection per address among every channel of the process
        # (its global subchannel pool): several clients of `serve --workers N` would all
        # land on the worker that took the first connection.
        ("grpc.use_local_subchannel_pool", 1),
    ]
    if tls is False:
        return grpc.aio.insecure_channel(channel_target(target), options)
    config = TlsConfig() if tls is True else tls
    return grpc.aio.secure_channel(channel_target(target), config.channel_credentials(), options)


class AgioClient:
    """One channel to an agio-grpc service and typed calls on it.

    `target`: one server's `host:port`, a gRPC target (`dns:///agio.internal:50051`), or
    several servers' addresses (a list, or one comma-separated string); the channel
    spreads calls over them round robin (`open_channel`). Each client has connections of
    its own, so several clients of one `serve --workers N` address spread over its workers.

    `tls`: False for plaintext, True for TLS with gRPC's default roots, or a TlsConfig.
    `token`: sent as `authorization: Bearer TOKEN` with every call the client makes (the
    raw stubs, `agents` and `sessions`, need it in their own `metadata`). `channel`: one
    the caller made instead (then `tls` is not used).
    """

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        channel: grpc.aio.Channel | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        token: str | None = None,
        tls: TlsConfig | bool = False,
    ) -> None:
        self._channel = channel or open_channel(target, tls)
        self._tls = None if channel else tls is not False
        credential = (("authorization", f"Bearer {token}"),) if token else ()
        self._metadata = credential + tuple(metadata)
        self.agents = agent_service_pb2_grpc.AgentServiceStub(self._channel)
        self.sessions = session_service_pb2_grpc.SessionServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    async def __aenter__(self) -> AgioClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channel.close()

    def _call_metadata(self) -> tuple[tuple[str, str], ...]:
        """The client's metadata plus the current trace context (`traceparent`), if any."""
        return self._metadata + trace_metadata()

    async def _unary(self, method: Any, request: Any, timeout: float | None = None) -> Any:
        try:
            return await method(request, metadata=self._call_metadata(), timeout=timeout)
        except grpc.aio.AioRpcError as error:
            raise decode_error(error, tls=self._tls) from None

    async def _stream(
        self, method: Any, request: Any, timeout: float | None = None
    ) -> AsyncIterator[events_pb2.StepEvent]:
        call = method(request, metadata=self._call_metadata(), timeout=timeout)
        try:
            async for event in call:
                yield event
        except grpc.aio.AioRpcError as error:
            raise decode_error(error, tls=self._tls) from None
        finally:
            call.cancel()

    # -- runs ---------------------------------------------------------------------------

    def run(
        self,
        input: str,
        *,
        session_id: str = "",
        agent: str = "",
        overrides: agent_service_pb2.RunOverrides | None = None,
        client_tools: Iterable[resources_pb2.ToolDefinition | Mapping[str, str]] = (),
        require_approval: Iterable[str] = (),
        request_id: str = "",
        metadata: Mapping[str, str] | None = None,
        on_busy: agent_service_pb2.BusyPolicy = agent_service_pb2.BUSY_POLICY_REJECT,
        on_disconnect: agent_service_pb2.DisconnectPolicy = (
            agent_service_pb2.DISCONNECT_POLICY_CANCEL
        ),
        output_schema: OutputSchema | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[events_pb2.StepEvent]:
        """Start a run and stream its events; the last one is run_completed or run_failed.

        Leaving the iteration early cancels the call, which cancels the run on the server
        (unless `on_disconnect` is DISCONNECT_POLICY_CONTINUE). `on_busy` says what to do
        when the session has a running, queued or waiting run (REJECT, ENQUEUE, INTERRUPT,
        ROLLBACK). `output_schema` (a JSON Schema, or a pydantic model class) is what the
        final answer must be: the terminal event's run carries it as `output`.
        """
        request = _run_request(
            input,
            session_id=session_id,
            agent=agent,
            overrides=overrides,
            client_tools=client_tools,
            require_approval=require_approval,
            request_id=request_id,
            metadata=metadata,
            on_busy=on_busy,
            on_disconnect=on_disconnect,
            output_schema=output_schema,
        )
        return self._stream(self.agents.Run, request, timeout)

    async def start_run(
        self,
        input: str,
        *,
        session_id: str = "",
        agent: str = "",
        overrides: agent_service_pb2.RunOverrides | None = None,
        client_tools: Iterable[resources_pb2.ToolDefinition | Mapping[str, str]] = (),
        require_approval: Iterable[str] = (),
        request_id: str = "",
        metadata: Mapping[str, str] | None = None,
        on_busy: agent_service_pb2.BusyPolicy = agent_service_pb2.BUSY_POLICY_REJECT,
        output_schema: OutputSchema | None = None,
        timeout: float | None = None,
    ) -> resources_pb2.Run:
        """Start a run in the background and return it at once (RUNNING, or QUEUED behind a
        busy session); follow it with `follow_run`, stop it with `cancel_run`."""
        request = _run_request(
            input,
            session_id=session_id,
            agent=agent,
            overrides=overrides,
            client_tools=client_tools,
            require_approval=require_approval,
            request_id=request_id,
            metadata=metadata,
            on_busy=on_busy,
            output_schema=output_schema,
        )
        response = await self._unary(self.agents.StartRun, request, timeout)
        run: resources_pb2.Run = response.run
        return run

    def submit_tool_outputs(
        self,
        run_id: str,
        outputs: Iterable[agent_service_pb2.ToolOutput],
        *,
        approvals: Iterable[agent_service_pb2.ToolApproval] = (),
        timeout: float | None = None,
    ) -> AsyncIterator[events_pb2.StepEvent]:
        """Continue a REQUIRES_ACTION run with the client tools' outputs and the decisions on
        its calls waiting for approval: all of `Run.required_action` at once."""
        request = agent_service_pb2.SubmitToolOutputsRequest(
            run_id=run_id, tool_outputs=list(outputs), approvals=list(approvals)
        )
        return self._stream(self.agents.SubmitToolOutputs, request, timeout)

    def approve(
        self, run_id: str, *tool_call_ids: str, reason: str = "", timeout: float | None = None
    ) -> AsyncIterator[events_pb2.StepEvent]:
        """Approve calls of a run waiting for approval (every one it waits for when no id is
        given) and follow the run as it goes on. A run that also waits for client outputs
        needs `submit_tool_outputs` with both."""
        return self._decide(run_id, tool_call_ids, True, reason, timeout)

    def reject(
        self, run_id: str, *tool_call_ids: str, reason: str = "", timeout: float | None = None
    ) -> AsyncIterator[events_pb2.StepEvent]:
        """Reject calls of a run waiting for approval (every one when no id is given): the
        model sees each was rejected, and `reason`; follow the run as it goes on."""
        return self._decide(run_id, tool_call_ids, False, reason, timeout)

    async def _decide(
        self,
        run_id: str,
        tool_call_ids: tuple[str, ...],
        approved: bool,
        reason: str,
        timeout: float | None,
    ) -> AsyncIterator[events_pb2.StepEvent]:
        ids = list(tool_call_ids)
        if not ids:
            run = await self.get_run(run_id)
            ids = [call.id for call in run.required_action.approvals]
        decisions = [
            agent_service_pb2.ToolApproval(tool_call_id=i, approved=approved, reason=reason)
            for i in ids
        ]
        async for event in self.submit_tool_outputs(
            run_id, (), approvals=decisions, timeout=timeout
        ):
            yield event

    def retry(
        self, session_id: str, sequence: int, *, timeout: float | None = None
    ) -> AsyncIterator[events_pb2.StepEvent]:
        """Delete steps from `sequence` on and regenerate."""
        request = agent_service_pb2.RetryRequest(session_id=session_id, sequence=sequence)
        return self._stream(self.agents.Retry, request, timeout)

    def watch_run(
        self, run_id: str, after_seq: int = 0, *, timeout: float | None = None
    ) -> AsyncIterator[events_pb2.StepEvent]:
        """Replay a run's events after `after_seq`, then follow it live."""
        request = agent_service_pb2.WatchRunRequest(run_id=run_id, after_seq=after_seq)
        return self._stream(self.agents.WatchRun, request, timeout)

    async def follow_run(
        self, run_id: str, after_seq: int = 0, *, reconnects: int = 10, backoff_s: float = 0.2
    ) -> AsyncIterator[events_pb2.StepEvent]:
        """`watch_run` that survives a server restart: when the stream breaks with
        UNAVAILABLE it watches again from the last seq it yielded, up to `reconnects` times in
        a row (waiting `backoff_s`, doubled each time, at most 5 s). Ends after the run's
        terminal event; with `after_seq` at that event's seq the server's stream is empty
        (status OK), and this ends at once, yielding nothing."""
        cursor, failures = after_seq, 0
        while True:
            try:
                async for event in self.watch_run(run_id, cursor):
                    yield event
                    cursor, failures = event.seq, 0
                    if event.WhichOneof("event") in ("run_completed", "run_failed"):
                        return
                return
            except AgioError as error:
                if error.code is not grpc.StatusCode.UNAVAILABLE or failures >= reconnects:
                    raise
            await asyncio.sleep(min(backoff_s * 2**failures, 5.0))
            failures += 1

    async def run_to_end(
        self, input: str, *, output_schema: OutputSchema | None = None, **kwargs: Any
    ) -> RunResult:
        """Run and collect: the final run, the last assistant text and the stored steps.

        With `output_schema`, the result's `output` is the run's answer: Python values, or
        an instance of the pydantic model given (checked by it once more). A run that ended
        without one (OUTPUT_INVALID, a limit) has None: its stop signal says why."""
        result = await collect(self.run(input, output_schema=output_schema, **kwargs))
        if isinstance(output_schema, type) and result.output is not None:
            result.output = output_schema.model_validate(result.output)
        return result

    async def cancel_run(self, run_id: str, reason: str = "") -> resources_pb2.Run:
        response = await self._unary(
            self.agents.CancelRun, agent_service_pb2.CancelRunRequest(run_id=run_id, reason=reason)
        )
        run: resources_pb2.Run = response.run
        return run

    async def get_run(self, run_id: str) -> resources_pb2.Run:
        response = await self._unary(
            self.agents.GetRun, agent_service_pb2.GetRunRequest(run_id=run_id)
        )
        run: resources_pb2.Run = response.run
        return run

    async def list_runs(self, session_id: str, page_size: int = 0) -> list[resources_pb2.Run]:
        """Every run of a session, newest first (follows page tokens)."""
        runs: list[resources_pb2.Run] = []
        token = ""
        while True:
            response = await self.list_runs_page(session_id, page_size, token)
            runs.extend(response.runs)
            token = response.next_page_token
            if not token:
                return runs

    async def list_runs_page(
        self, session_id: str, page_size: int = 0, page_token: str = ""
    ) -> agent_service_pb2.ListRunsResponse:
        """One page of a session's runs, newest first, with the token of the next page."""
        response: agent_service_pb2.ListRunsResponse = await self._unary(
            self.agents.ListRuns,
            agent_service_pb2.ListRunsRequest(
                session_id=session_id, page_size=page_size, page_token=page_token
            ),
        )
        return response

    async def list_agents(self) -> list[resources_pb2.Agent]:
        response = await self._unary(self.agents.ListAgents, agent_service_pb2.ListAgentsRequest())
        return list(response.agents)

    # -- sessions -----------------------------------------------------------------------

    async def get_session(self, session_id: str) -> resources_pb2.Session:
        response = await self._unary(
            self.sessions.GetSession, session_service_pb2.GetSessionRequest(session_id=session_id)
        )
        session: resources_pb2.Session = response.session
        return session

    async def list_sessions(self, page_size: int = 0) -> list[resources_pb2.Session]:
        """Every session, newest first (follows page tokens)."""
        sessions: list[resources_pb2.Session] = []
        token = ""
        while True:
            response = await self.list_sessions_page(page_size, token)
            sessions.extend(response.sessions)
            token = response.next_page_token
            if not token:
                return sessions

    async def list_sessions_page(
        self, page_size: int = 0, page_token: str = ""
    ) -> session_service_pb2.ListSessionsResponse:
        """One page of sessions, newest first, with the token of the next page."""
        response: session_service_pb2.ListSessionsResponse = await self._unary(
            self.sessions.ListSessions,
            session_service_pb2.ListSessionsRequest(page_size=page_size, page_token=page_token),
        )
        return response

    async def list_steps(
        self, session_id: str, start_sequence: int = 0, end_sequence: int = 0, page_size: int = 0
    ) -> list[resources_pb2.Step]:
        """The session's steps in sequence order (follows page tokens)."""
        steps: list[resources_pb2.Step] = []
        token = ""
        while True:
            response = await self._unary(
                self.sessions.ListSteps,
                session_service_pb2.ListStepsRequest(
                    session_id=session_id,
                    start_sequence=start_sequence,
                    end_sequence=end_sequence,
                    page_size=page_size,
                    page_token=token,
                ),
            )
            steps.extend(response.steps)
            token = response.next_page_token
            if not token:
                return steps

    async def get_step(self, session_id: str, sequence: int) -> resources_pb2.Step:
        response = await self._unary(
            self.sessions.GetStep,
            session_service_pb2.GetStepRequest(session_id=session_id, sequence=sequence),
        )
        step: resources_pb2.Step = response.step
        return step

    async def delete_steps(self, session_id: str, start_sequence: int) -> int:
        response = await self._unary(
            self.sessions.DeleteSteps,
            session_service_pb2.DeleteStepsRequest(
                session_id=session_id, start_sequence=start_sequence
            ),
        )
        return int(response.deleted_count)

    async def fork_session(self, session_id: str, sequence: int = 0) -> resources_pb2.Session:
        response = await self._unary(
            self.sessions.ForkSession,
            session_service_pb2.ForkSessionRequest(session_id=session_id, sequence=sequence),
        )
        session: resources_pb2.Session = response.session
        return session

    async def get_context(
        self, session_id: str, agent: str = ""
    ) -> session_service_pb2.GetContextResponse:
        """The whole context, its pages joined (a page token is refused once the session
        changed: then this raises AgioError INVALID_ARGUMENT)."""
        whole = session_service_pb2.GetContextResponse()
        token = ""
        while True:
            page: session_service_pb2.GetContextResponse = await self._unary(
                self.sessions.GetContext,
                session_service_pb2.GetContextRequest(
                    session_id=session_id, agent=agent, page_token=token
                ),
            )
            whole.messages.extend(page.messages)
            whole.summary.CopyFrom(page.summary)
            token = page.next_page_token
            if not token:
                return whole

    async def compact_session(
        self, session_id: str, keep_recent_steps: int = 0, agent: str = ""
    ) -> session_service_pb2.CompactSessionResponse:
        """Summarize the session's older steps now (refused while a run holds it)."""
        response: session_service_pb2.CompactSessionResponse = await self._unary(
            self.sessions.CompactSession,
            session_service_pb2.CompactSessionRequest(
                session_id=session_id, keep_recent_steps=keep_recent_steps, agent=agent
            ),
        )
        return response

    async def delete_session(self, session_id: str) -> int:
        response = await self._unary(
            self.sessions.DeleteSession,
            session_service_pb2.DeleteSessionRequest(session_id=session_id),
        )
        return int(response.deleted_steps)

    async def health(self, service: str = "") -> str:
        """The serving status name, e.g. `SERVING`."""
        response = await self._unary(
            self._health.Check, health_pb2.HealthCheckRequest(service=service)
        )
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


async def collect(events: AsyncIterator[events_pb2.StepEvent]) -> RunResult:
    """Drain a run stream into a RunResult; raises if the stream ends without a terminal event."""
    steps: list[resources_pb2.Step] = []
    count = 0
    async for event in events:
        count += 1
        kind = event.WhichOneof("event")
        if kind == "step_completed":
            steps.append(event.step_completed.step)
        elif kind in ("run_completed", "run_failed"):
            run = getattr(event, kind).run
            text = next(
                (
                    s.content
                    for s in reversed(steps)
                    if s.role == resources_pb2.ROLE_ASSISTANT and s.content
                ),
                "",
            )
            return RunResult(
                run=run, text=text, steps=steps, events=count, output=output_value(run)
            )
    raise AgioError(grpc.StatusCode.UNKNOWN, "the run stream ended without a terminal event")
