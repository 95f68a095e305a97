"""The running service: store, engine runtime and gRPC server wired together.

`AgioApp.start(settings)` chooses how callers are authenticated (refusing to start open to
the network when no one chose), opens the store (applying migrations), finalises runs a crashed
server left RUNNING (those whose session lease expired), starts the built-in fake model when
no endpoint is configured, builds the runtime from the configured agents, tools and hooks
(the runtime renews the session leases of its runs), and binds the server: plaintext, or
TLS when AGIO_TLS_CERT_FILE is set (its files are checked right after the listen address,
before anything starts). `serve` adds signal handling for `agio-grpc serve` (SIGHUP
re-reads the TLS files), and freezes the start-up heap out of the garbage collector's scans
(the process is the service's; tests that start an app in process keep their collector
untouched).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import secrets
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import grpc
from a2a.server.request_handlers.grpc_handler import GrpcHandler
from a2a.types import a2a_pb2_grpc

from agio_grpc.config import AgentConfig, AuthMode, Settings, approval_tools
from agio_grpc.engine import BUILTIN_TOOLS
from agio_grpc.engine.agent_tools import AgentTools, agent_tool_name, check_agent_calls
from agio_grpc.engine.agents import AgentSpec, Compaction, Limits
from agio_grpc.engine.compaction import default_context_window
from agio_grpc.engine.hooks import Hooks
from agio_grpc.engine.lifecycle import Lifecycle
from agio_grpc.engine.models.openai_chat import OpenAIModelDriver
from agio_grpc.engine.options import RuntimeOptions
from agio_grpc.engine.output import OutputSpec
from agio_grpc.engine.runtime import Runtime
from agio_grpc.engine.session_compaction import SessionCompactor
from agio_grpc.engine.storage import Storage
from agio_grpc.engine.tools import ToolRegistry, config_tool_name
from agio_grpc.service.a2a.handler import AgentTasks
from agio_grpc.service.a2a.push import PushNotifier
from agio_grpc.service.a2a.remote import remote_agents_of
from agio_grpc.service.agent_service import AgentServicer
from agio_grpc.service.auth import (
    Authenticator,
    AuthInterceptor,
    build_authenticator,
    choose_auth_mode,
    reflection_enabled,
)
from agio_grpc.service.members import TOKEN_SECRET as MEMBER_TOKEN_SECRET
from agio_grpc.service.members import MemberCalls, MemberListener
from agio_grpc.service.server import BoundServer, install_signal_handlers, start_grpc_server
from agio_grpc.service.session_service import SessionServicer
from agio_grpc.service.startup import (
    cannot_listen,
    check_bindable,
    loading,
    one_line,
    opening_store,
)
from agio_grpc.service.tls import ServerCertificates
from agio_grpc.service.validation import PageTokens
from agio_grpc.service.worker import WorkerRole
from agio_grpc.store.keys import KeyStore
from agio_grpc.store.leases import MemberDirectory, SessionLeases
from agio_grpc.store.log import SessionLog
from agio_grpc.store.records import TenantQuotas
from agio_grpc.store.runs import RunRecords
from agio_grpc.store.sql import SqlStore, open_store
from agio_grpc.telemetry import (
    Instruments,
    OtelRunTracer,
    Telemetry,
    TracedHttp,
    TracingInterceptor,
    instrumented,
    telemetry_from_environment,
    trace_metadata,
)
from agio_grpc.testing import FakeModelServer
from agio_grpc.v1 import agent_service_pb2_grpc, session_service_pb2_grpc

if TYPE_CHECKING:
    from agio_grpc.engine.mcp import McpServers
    from agio_grpc.service.http_listener import HttpListener

log = logging.getLogger(__name__)

RUN_DRAIN_MARGIN_S = 0.5
HTTP_ADDRESS_SETTING = "AGIO_HTTP_ADDRESS"


PAGE_TOKEN_KEY = "page_tokens"
"""The name of the store's secret that signs page tokens."""


MEMBER_ADDRESS_SETTING = "AGIO_SERVER__MEMBER_ADDRESS"


def instance_id(settings: Settings) -> str:
    """The configured instance id, else `HOSTNAME/LISTEN_ADDRESS`: stable across restarts,
    and distinct for servers listening apart. On a port picked at bind time, which a restart
    never gets again, one of this process's own (`HOSTNAME/pid-RANDOM`): the runs it leaves
    end after their lease, as a restart does not know it."""
    if settings.server.instance_id:
        return settings.server.instance_id
    if settings.listen_address.rpartition(":")[2] == "0":
        return f"{socket.gethostname()}/{os.getpid()}-{secrets.token_hex(4)}"
    return f"{socket.gethostname()}/{settings.listen_address}"


def build_registry(settings: Settings) -> ToolRegistry:
    """The built-in tools plus those of `tool_modules`; every agent's tools must exist."""
    registry = ToolRegistry(BUILTIN_TOOLS)
    for spec in settings.tool_modules:
        registry.load(spec)
    for agent in settings.agents:
        # `server.tool` names an MCP server's tool: service/mcp_setup.py checks those.
        missing = [name for name in agent.tools if "." not in name and name not in registry]
        if missing:
            raise ValueError(
                f"agent {agent.name!r} lists unknown tools {missing}; "
                f"registered: {registry.names()}"
            )
    return registry


def agent_tools_of(
    settings: Settings, agents: dict[str, AgentSpec], registry: ToolRegistry
) -> AgentTools:
    """Every agent as a tool (`agents:`), attached to `registry`; ValueError for a call of
    an unknown agent, a cycle, or an agent whose tool name a registered tool has."""
    check_agent_calls(agents)
    for agent in agents.values():
        for callee in agent.agents:
            if agent_tool_name(callee) in registry.names():
                raise ValueError(
                    f"agent {agent.name!r} calls agent {callee!r}, whose tool name "
                    f"{agent_tool_name(callee)!r} is a registered tool's"
                )
    tools = AgentTools(agents, settings.server.max_agent_depth)
    registry.attach(tools)
    return tools


def mcp_servers_of(settings: Settings, registry: ToolRegistry) -> McpServers | None:
    """The configured MCP servers, attached to `registry` (not started); None without any.

    The mcp SDK takes about a second to import: only a service configured with MCP servers
    imports it (and pays that at start-up)."""
    if not settings.mcp_servers:
        return None
    from agio_grpc.service.mcp_setup import build_mcp_servers

    return build_mcp_servers(settings, registry)


def build_agents(settings: Settings) -> dict[str, AgentSpec]:
    return {
        agent.name: AgentSpec(
            name=agent.name,
            model=agent.model,
            instructions=agent.instructions,
            description=agent.description,
            agents=list(agent.agents),
            tools=[
                *(config_tool_name(name) for name in agent.tools),
                *(agent_tool_name(name) for name in agent.agents),
                *(entry.name for entry in agent.a2a_agents),
            ],
            mcp_servers=list(agent.mcp),
            limits=Limits(**agent.limits.model_dump()),
            temperature=agent.temperature,
            max_tokens=agent.max_tokens,
            stop_on_error_tools=[config_tool_name(name) for name in agent.stop_on_error_tools()],
            approval_tools=[
                config_tool_name(name) for name in approval_tools(agent, settings.mcp_servers)
            ],
            approval_servers=[s.name for s in settings.mcp_servers if s.needs_approval is True],
            approval_timeout_s=agent.approval_timeout_s,
            compaction=Compaction(
                context_window_tokens=(
                    agent.context_window_tokens or default_context_window(agent.model)
                ),
                **agent.compaction.model_dump(),
            ),
            output=_output_spec(agent),
        )
        for agent in settings.agents
    }


def _output_spec(agent: AgentConfig) -> OutputSpec | None:
    schema = agent.output_schema
    if schema is None:
        return None
    assert isinstance(schema, dict), "the configuration's check reads a schema file"
    return OutputSpec(schema, agent.output_mode, agent.output_retries)


@dataclass(slots=True)
class AgioApp:
    """A started service. `stop` drains it; it is safe to call once."""

    settings: Settings
    log: SessionLog
    """The store's session log (instrumented), as the services read it."""
    runtime: Runtime
    model: OpenAIModelDriver
    bound: BoundServer
    fake_model: FakeModelServer | None
    telemetry: Telemetry
    pages: PageTokens
    """Signs and checks page tokens with the key every replica shares."""
    mcp_servers: McpServers | None
    """The connections to the configured MCP servers (None: none configured)."""
    _resources: contextlib.AsyncExitStack
    """What `start` opened, closed in reverse by `stop` once the calls and runs drained."""
    authenticator: Authenticator | None = None
    """Who may call (None: `auth.mode: none`, everyone in the default tenant)."""
    certificates: ServerCertificates | None = None
    """The TLS material, which `reload_certificates` re-reads; None for plaintext."""
    members: MemberListener | None = None
    """The member listener: the calls of the other servers of the database."""
    member_calls: MemberCalls | None = None
    """This server's calls to the other members."""
    http: HttpListener | None = None
    """The HTTP listener (Connect, gRPC-Web) when `http_address` is set."""

    @property
    def address(self) -> str:
        return self.bound.address

    @property
    def port(self) -> int:
        return self.bound.port

    @classmethod
    async def start(
        cls,
        settings: Settings,
        telemetry: Telemetry | None = None,
        *,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        worker: WorkerRole | None = None,
    ) -> AgioApp:
        """Start the service; `telemetry` defaults to what the `OTEL_*` variables configure
        (the app then owns it and shuts it down on `stop`). `interceptors` go after the
        service's own, just before the error mapping (an embedder's, a test's). As a
        `worker` of `serve --workers N` it shares the port its supervisor checked.

        Everything it opens goes on one exit stack as it opens, so a start that fails closes
        what it opened (in reverse), and `stop` closes the rest the same way once the calls
        and runs are drained."""
        auth_mode = choose_auth_mode(settings)
        if worker is None:
            check_bindable(settings.listen_address)
            if settings.http_address:
                check_bindable(settings.http_address, HTTP_ADDRESS_SETTING)
        check_bindable(settings.server.member_address, MEMBER_ADDRESS_SETTING)
        certificates = ServerCertificates.load(settings)
        with loading("tools", "AGIO_TOOL_MODULES, or an agent's tools in AGIO_CONFIG"):
            registry = build_registry(settings)
            agents = build_agents(settings)
            agent_tools = agent_tools_of(settings, agents, registry)
            remote_agents = remote_agents_of(settings, registry, trace_metadata)
        mcp_servers = mcp_servers_of(settings, registry)
        with loading("hooks", "AGIO_HOOKS__*, or hooks in AGIO_CONFIG"):
            hooks = Hooks.load(**settings.hooks.model_dump())
        telemetry = telemetry or telemetry_from_environment()
        own_id = worker.instance_id(instance_id(settings)) if worker else instance_id(settings)
        async with contextlib.AsyncExitStack() as opened:
            # Last: the spans of what closes before it are flushed (exporting blocks).
            opened.push_async_callback(asyncio.to_thread, telemetry.shutdown)
            with opening_store(settings.database_url):
                sql_store = await open_store(
                    settings.database_url,
                    sqlite_synchronous=settings.sqlite_synchronous,
                    pool_size=settings.database_pool_size,
                    session_lease_s=settings.server.session_lease_s,
                    instance_id=own_id,
                    quotas=TenantQuotas(
                        max_running_runs=settings.quotas.max_running_runs_per_tenant,
                        max_queued_runs=settings.quotas.max_queued_runs_per_tenant,
                    ),
                )
            opened.push_async_callback(sql_store.close)
            if remote_agents is not None:
                # Cards are read in the background; an agent not up keeps being tried.
                opened.push_async_callback(remote_agents.stop)
                remote_agents.start()
            if mcp_servers is not None:
                # Connections open now; a server not up keeps trying (tools unavailable).
                opened.push_async_callback(mcp_servers.stop)
                await mcp_servers.start()
            model, fake_model, base_url = await _open_model(settings, opened)
            tracer = OtelRunTracer(telemetry, provider=model.provider, base_url=base_url)
            roles = _instrumented_roles(sql_store, tracer.instruments)
            authenticator = build_authenticator(settings, auth_mode, roles.keys)
            if authenticator is not None:
                opened.push_async_callback(authenticator.close)  # its last writes of keys' use
            await _recover(roles.lifecycle)
            member_token = (await sql_store.server_secret(MEMBER_TOKEN_SECRET)).hex()
            member_calls = MemberCalls(roles.members, own_id, member_token)
            opened.push_async_callback(member_calls.close)
            runtime = Runtime(
                storage=Storage(roles.log, roles.runs, roles.lifecycle, roles.leases),
                agents=agents,
                default_agent=settings.default_agent,
                registry=registry,
                model=model,
                hooks=hooks,
                tracer=tracer,
                remote=member_calls,
                options=RuntimeOptions(
                    history_cache_bytes=int(settings.server.history_cache_mb * 1_000_000),
                    max_queued_runs=settings.server.max_queued_runs,
                    max_running_runs=settings.server.max_running_runs or None,
                    admission_wait_s=settings.server.admission_wait_s,
                ),
            )
            tracer.instruments.history_cache_bytes.observe(runtime.history_cache_bytes)
            agent_tools.bind(runtime)
            runtime.start()  # the lease keeper: renewals, cross-replica cancels, queue sweeps
            members = MemberListener(runtime, roles.leases, member_token)
            # Stopped after the runs end: a member following one here gets its terminal event.
            opened.push_async_callback(members.stop)
            # Only on a failed start: a started app's stop drains the runtime before this.
            opened.push_async_callback(runtime.shutdown, 0.0)
            bind, advertise = (
                settings.server.member_address,
                settings.server.member_advertise_address,
            )
            try:
                await members.start(roles.members, bind, advertise)
            except RuntimeError as error:  # bound by another process since the check
                raise cannot_listen(
                    bind, one_line(error), setting=MEMBER_ADDRESS_SETTING
                ) from error
            pages = PageTokens(await sql_store.server_secret(PAGE_TOKEN_KEY))
            page_bytes = settings.server.max_message_bytes * 3 // 4
            agent_servicer = AgentServicer(runtime, settings.server, pages)
            push = PushNotifier(runtime, sql_store.push_configs(), settings.a2a)
            opened.push_async_callback(push.stop)
            await push.resume()
            register: list[tuple[object, object]] = [
                (agent_service_pb2_grpc.add_AgentServiceServicer_to_server, agent_servicer),
                (
                    session_service_pb2_grpc.add_SessionServiceServicer_to_server,
                    SessionServicer(
                        roles.log,
                        runtime,
                        SessionCompactor(roles.log, model, registry, tracer, runtime.agent),
                        pages,
                        page_bytes,
                    ),
                ),
                # A2A's gRPC binding: the agent each request's A2A tenant names.
                (
                    a2a_pb2_grpc.add_A2AServiceServicer_to_server,
                    GrpcHandler(AgentTasks(runtime, agent_servicer, pages, push)),
                ),
            ]
            chain: list[grpc.aio.ServerInterceptor] = [
                # Installed with tracing off too: the caller's trace context still becomes
                # the run's and its steps' trace ids (a no-op tracer carries it on).
                TracingInterceptor(telemetry.tracer_provider),
                *([AuthInterceptor(authenticator)] if authenticator is not None else []),
                *interceptors,
            ]
            response_metadata = worker.response_metadata() if worker else ()
            try:
                bound = await start_grpc_server(
                    settings,
                    register,
                    interceptors=chain,
                    reflection=reflection_enabled(settings, auth_mode),
                    credentials=certificates.credentials() if certificates else None,
                    share_port=worker is not None,
                    response_metadata=response_metadata,
                )
            except OSError as error:  # bound by another process since check_bindable
                raise cannot_listen(settings.listen_address, one_line(error)) from error
            http = await _serve_over_http(
                settings,
                bound,
                register,
                chain,
                share_port=worker is not None,
                response_metadata=response_metadata,
                a2a=A2AParts(
                    runtime, agent_servicer, pages, push, authenticator, auth_mode, telemetry
                ),
            )
            resources = opened.pop_all()
        log.info(
            "agio-grpc %slistening on %s%s (authentication: %s)%s",
            f"{worker.name()} " if worker else "",
            bound.address,
            _transport(certificates),
            auth_mode,
            f"; HTTP (Connect, gRPC-Web) on {http.address}" if http else "",
        )
        return cls(
            settings,
            roles.log,
            runtime,
            model,
            bound,
            fake_model,
            telemetry,
            pages,
            mcp_servers,
            resources,
            authenticator,
            certificates,
            members,
            member_calls,
            http,
        )

    def reload_certificates(self) -> bool:
        """Re-read the TLS files (SIGHUP): new connections get the new certificate, open
        ones keep theirs. False when there is no TLS or the new files failed their checks
        (the current ones stay)."""
        return self.certificates.reload() if self.certificates else False

    async def stop(self, grace: float | None = None) -> None:
        """Health NOT_SERVING, refuse new calls, let running ones finish within `grace`,
        interrupt runs still active, then close the model and the store."""
        grace_s = self.settings.server.grace_period_s if grace is None else grace
        await self.bound.health.enter_graceful_shutdown()
        # Runs get slightly less than the calls' grace, so an interrupted run's terminal
        # event still reaches its client before the server cancels the call.
        await asyncio.gather(
            self.bound.server.stop(grace_s),
            *([self.http.stop(grace_s)] if self.http else []),
            self.runtime.shutdown(max(grace_s - RUN_DRAIN_MARGIN_S, 0.0)),
        )
        # Calls cancelled by the server's stop may have left runs to end and sessions to
        # release (Runtime._clean_up): they need the store.
        await self.runtime.settle()
        # Then what start opened, in reverse: the members, the model, the authenticator,
        # the store, and last the telemetry (the spans of runs interrupted above flushed).
        await self._resources.aclose()


@dataclass(frozen=True, slots=True)
class _Roles:
    """The store's roles, each wrapped once in telemetry; the ledger only inside the
    lifecycle, which is the only thing given it."""

    log: SessionLog
    runs: RunRecords
    lifecycle: Lifecycle
    leases: SessionLeases
    members: MemberDirectory
    keys: KeyStore


def _instrumented_roles(store: SqlStore, instruments: Instruments) -> _Roles:
    log = instrumented(store.log, instruments)
    return _Roles(
        log=log,
        runs=instrumented(store.runs, instruments),
        lifecycle=Lifecycle(instrumented(store.ledger, instruments), log),
        leases=instrumented(store.leases, instruments),
        members=instrumented(store.members, instruments),
        keys=instrumented(store.keys(), instruments),
    )


async def _recover(lifecycle: Lifecycle) -> None:
    """End the runs a stopped server left RUNNING: this instance's (it restarted), and those
    whose leases expired. Only those: safe beside live replicas."""
    recovered = await lifecycle.recover_own()
    recovered += await lifecycle.recover_expired()
    if recovered:
        log.warning(
            "interrupted %d run(s) left running by a stopped server: %s",
            len(recovered),
            ", ".join(recovered),
        )


async def _open_model(
    settings: Settings, opened: contextlib.AsyncExitStack
) -> tuple[OpenAIModelDriver, FakeModelServer | None, str]:
    """The model driver for the configured endpoint, or for the built-in fake model started
    here when none is configured (both closed by `opened`), and its URL."""
    base_url = settings.openai_base_url
    api_key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else ""
    fake_model: FakeModelServer | None = None
    if base_url is None:
        fake_model = FakeModelServer()
        await fake_model.start()
        opened.push_async_callback(fake_model.stop)
        base_url = fake_model.base_url
        log.warning("no OPENAI_BASE_URL set: using the built-in fake model at %s", base_url)
    model = OpenAIModelDriver(base_url=base_url, api_key=api_key or "unused")
    opened.push_async_callback(model.close)
    return model, fake_model, base_url


@dataclass(frozen=True, slots=True)
class A2AParts:
    """What A2A on the HTTP listener is built from."""

    runtime: Runtime
    agents: AgentServicer
    pages: PageTokens
    push: PushNotifier
    authenticator: Authenticator | None
    auth_mode: AuthMode
    telemetry: Telemetry


async def _serve_over_http(
    settings: Settings,
    bound: BoundServer,
    register: list[tuple[object, object]],
    interceptors: Sequence[grpc.aio.ServerInterceptor],
    *,
    share_port: bool,
    response_metadata: tuple[tuple[str, str], ...],
    a2a: A2AParts,
) -> HttpListener | None:
    """The HTTP listener beside the started gRPC server (None without `http_address`); the
    gRPC server is stopped when the listener cannot start.

    hypercorn and connectrpc take about a quarter of a second to import: only a service
    configured with an HTTP listener imports them."""
    if not settings.http_address:
        return None
    from agio_grpc.service.a2a.http import a2a_application
    from agio_grpc.service.http_listener import serve_over_http

    try:
        return await serve_over_http(
            settings,
            register,
            interceptors,
            bound.health,
            share_port=share_port,
            response_metadata=response_metadata,
            a2a=a2a_application(
                a2a.runtime,
                a2a.agents,
                a2a.pages,
                a2a.push,
                authenticator=a2a.authenticator,
                auth_mode=a2a.auth_mode,
                grpc_port=bound.port,
                max_bytes=settings.server.max_message_bytes,
                traced=lambda app: TracedHttp(app, a2a.telemetry.tracer_provider),
            ),
        )
    except BaseException as error:
        await bound.server.stop(0)
        if isinstance(error, OSError):
            raise cannot_listen(
                settings.http_address, one_line(error), setting=HTTP_ADDRESS_SETTING
            ) from error
        raise


def _transport(certificates: ServerCertificates | None) -> str:
    """How clients reach the server, for the "listening" line."""
    if certificates is None:
        return ""
    kind = "mutual TLS" if certificates.mutual else "TLS"
    return f" ({kind}: {certificates.current.describe()})"


COLLECTOR_THRESHOLDS: Final = (2000, 10, 1000)
"""The garbage collector's thresholds once the service is up; Python's own are (700, 10, 10).

A full collection walks every object the live runs hold, and under a rising load Python
starts one each time that heap has grown by a quarter: with 1,000 runs streaming it paused
the event loop 170-210 ms seven or eight times, to find what the next young collection finds
anyway (the cycles left over after those 1,000 runs: about 4,000 objects either way). Here a
full collection waits for 1,000 collections of the middle generation rather than 10, and
the young one for 2,000 new objects rather than 700 (fewer, slightly longer pauses: at most
20-40 ms under that load). B4 (docs/benchmarks/NOTES.md, change 32)."""


def tune_collector() -> None:
    """Once the service is up: move everything loaded so far out of the garbage
    collector's reach, and set COLLECTOR_THRESHOLDS.

    The modules, classes and the wired app live as long as the process, so full
    collections need not walk them on every pass (`gc.freeze()`). B4 at 100 runs, 6-7 runs
    each way: p99 token gap over the pace +3 to +12 ms (median +7) against +10 to +84 ms
    (median +13): fewer and shorter collection pauses.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(*COLLECTOR_THRESHOLDS)


async def serve(settings: Settings, worker: WorkerRole | None = None) -> None:
    """Run until SIGTERM or SIGINT (a `worker`: or until its supervisor is gone), then
    drain."""
    telemetry = telemetry_from_environment()
    telemetry.install_global()
    if telemetry.tracing:
        log.info("tracing on: spans are exported as the OTEL_* variables configure")
    app = await AgioApp.start(settings, telemetry, worker=worker)
    tune_collector()
    stop = asyncio.Event()
    install_signal_handlers(stop, app.reload_certificates if app.certificates else None)
    if worker is not None:
        worker.watch_supervisor(stop)
        worker.report_ready()
    await stop.wait()
    log.info("shutting down: draining for up to %.1fs", settings.server.grace_period_s)
    await app.stop()
    log.info("stopped")
