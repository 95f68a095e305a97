"""Settings of `agio-grpc serve`: environment variables over an optional YAML file.

Names and defaults follow DESIGN.md section 7. `AGIO_CONFIG` names the file; every other
variable wins over the file. The file also holds what does not fit in a variable: agents,
tool modules, hooks and server tuning. Never imports grpc or the engine.
"""

from __future__ import annotations

import ipaddress
import json
import os
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

DEFAULT_INSTRUCTIONS = (
    "You are a helpful assistant. Use the tools when they help; answer concisely."
)
MAX_STEPS_LIMIT = 1000
"""The highest `max_steps` an agent or a run's overrides may set."""
KIB = 1024
MIB = 1024 * KIB
MAX_WORKERS = 1024
"""The most worker processes `server.workers` may ask for."""


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity, which containers and `taskset`
    narrow), else the machine's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def parse_workers(value: object) -> object:
    """`server.workers` as written: `auto` is the number of available cores, a numeral its
    number; anything else is refused with a message naming both forms."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "auto":
            return available_cores()
        if not text.isdigit():
            raise ValueError(
                f"must be a number of worker processes (1..{MAX_WORKERS}) or auto, got {value!r}"
            )
        return int(text)
    return value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LimitsConfig(_Strict):
    """Limits of one agent's runs."""

    max_steps: int = Field(10, ge=1, le=MAX_STEPS_LIMIT)
    """The maximum model calls in a run."""
    token_budget: int | None = Field(None, ge=1)
    """The maximum tokens (input + output over all model calls) a run may use."""
    run_timeout_s: float = Field(300.0, gt=0)
    """Wall time a run may take; a shorter gRPC deadline wins."""
    tool_timeout_s: float = Field(30.0, gt=0)
    """Hard timeout of one tool call."""
    max_parallel_tools: int = Field(4, ge=1, le=64)
    """How many tool calls of one step run at once."""
    max_history_messages: int | None = Field(None, ge=1)
    """Cap on history messages sent to the model (a tool call is never split from its result)."""
    max_step_bytes: int = Field(4 * MIB, ge=KIB)
    """The largest model reply or server tool result a run stores (UTF-8 bytes of its texts):
    a larger one is cut to it and ends the run (MAX_TOKENS, TOOL_ERROR). At most half of
    `server.max_message_bytes`, so that every step and event fits in a message."""


class ToolOptionsConfig(_Strict):
    """How an agent runs one of its tools."""

    on_error: Literal["continue", "stop"] = "continue"
    """What an error result of the tool (an exception, a timeout, arguments that are not
    valid) does. `continue`: the model gets it as the call's result and acts on it. `stop`:
    it is stored as the call's result all the same, then the run ends with
    STOP_REASON_TOOL_ERROR (the step's other calls still run to their results)."""
    needs_approval: bool = False
    """A call waits for a person's decision before it runs: the run ends its segment in
    REQUIRES_ACTION with the call in `Run.required_action.approvals` (docs/approvals.md)."""


class CompactionConfig(_Strict):
    """When and how an agent's long sessions are compacted (docs/compaction.md)."""

    enabled: bool = True
    """Summarize the oldest steps above the trigger, and once on a provider's
    context_length_exceeded; false leaves only `limits.max_history_messages`."""
    trigger_ratio: float = Field(0.8, gt=0, le=1)
    """Compact when the estimated prompt passes this share of `context_window_tokens`."""
    keep_recent_steps: int = Field(20, ge=0, le=100_000)
    """Steps kept as they are after the summary (a tool call never split from its result)."""
    model: str | None = Field(None, min_length=1)
    """The model that writes summaries; unset: the agent's model."""
    instructions: str | None = Field(None, min_length=1)
    """The summary call's system prompt; unset: the built-in one."""


class AgentConfig(_Strict):
    """A named agent: model, instructions, tools and limits."""

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
    model: str = "fake-model"
    """The model name sent to the endpoint."""
    instructions: str = DEFAULT_INSTRUCTIONS
    """The system prompt."""
    tools: list[str] = Field(default_factory=lambda: ["current_time", "calculate"])
    """Names of registered tools the agent offers; `server.tool` names one tool of the MCP
    server `server` (of `mcp_servers`)."""
    mcp: list[str] = Field(default_factory=list)
    """MCP servers (of `mcp_servers`, by name) whose every tool the agent offers, as the
    server lists them at the time of each run."""
    tool_options: dict[str, ToolOptionsConfig] = Field(default_factory=dict)
    """Per tool of `tools` (by name): how the agent runs it. A tool not named here gets the
    defaults (`on_error: continue`)."""
    temperature: float | None = Field(None, ge=0, le=2)
    max_tokens: int | None = Field(None, ge=1)
    """Completion token cap per model call."""
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    context_window_tokens: int | None = Field(None, ge=1_000, le=100_000_000)
    """The model's context window in tokens; unset: from the model's family (gpt-4o 128,000,
    claude 200,000, ...; engine/compaction.py), else 128,000."""
    compaction: CompactionConfig = Field(default_factory=CompactionConfig)
    output_schema: dict[str, Any] | Path | None = None
    """A JSON Schema the final answer of the agent's runs must satisfy (docs/structured-output.md):
    the schema itself, or the path of a JSON file holding it. A run's `output_schema_json`
    replaces it."""
    output_mode: Literal["json_schema", "json_object", "tool"] = "json_schema"
    """How the model is asked for the schema: `response_format: json_schema` (strict), or
    `json_object` with the schema in a system message, or `tool` (a `final_output` tool whose
    parameters are the schema), for servers that do not know the first."""
    output_retries: int = Field(1, ge=0, le=10)
    """Repair calls after an answer that is not valid against the schema, before the run
    stops with OUTPUT_INVALID."""

    @field_validator("output_schema")
    @classmethod
    def _output_schema_is_usable(
        cls, value: dict[str, Any] | Path | None
    ) -> dict[str, Any] | Path | None:
        if value is None:
            return None
        # Imported here: the engine is more than reading the configuration needs.
        from agio_grpc.engine.output import OutputSchemaError, checked_schema, schema_from_text

        try:
            if isinstance(value, Path):
                return schema_from_text(value.read_text(encoding="utf-8"))
            return checked_schema(value)
        except OSError as error:
            raise ValueError(f"cannot read {value}: {error.strerror or error}") from None
        except OutputSchemaError as error:
            raise ValueError(f"output_schema {error}") from None

    approval_timeout_s: float | None = Field(None, gt=0)
    """How long a call waits for approval: past it the server rejects the pending calls
    with reason "timed out" and the run goes on. Unset: a call waits until decided or the
    run is cancelled."""

    @model_validator(mode="after")
    def _options_name_its_tools(self) -> AgentConfig:
        strangers = [name for name in self.tool_options if name not in self.tools]
        if strangers:
            raise ValueError(
                f"tool_options names {', '.join(map(repr, strangers))}, not among the "
                f"agent's tools ({', '.join(self.tools) or 'none'})"
            )
        return self

    def approval_tools(self) -> list[str]:
        """The tools whose calls wait for approval (`needs_approval: true`), in `tools` order."""
        return [
            name
            for name in self.tools
            if name in self.tool_options and self.tool_options[name].needs_approval
        ]

    def stop_on_error_tools(self) -> list[str]:
        """The tools whose error result ends the run (`on_error: stop`), in `tools` order."""
        return [
            name
            for name in self.tools
            if name in self.tool_options and self.tool_options[name].on_error == "stop"
        ]


MCP_SERVER_NAME = r"^[A-Za-z][A-Za-z0-9-]{0,31}$"
"""An MCP server's name: no `_` or `.`, so `server__tool` and `server.tool` split one way."""


class McpServerConfig(_Strict):
    """An MCP server whose tools agents may offer: a command run over stdio (`command`), or a
    Streamable HTTP endpoint (`url`). docs/tools.md tells the whole story."""

    name: str = Field(pattern=MCP_SERVER_NAME)
    """How agents name it (`mcp: [name]`, `name.tool`); its tools reach the model as
    `name__tool`."""
    command: str | None = None
    """stdio: the program to run (an absolute path, or a name looked up on the service's
    PATH at start-up)."""
    args: list[str] = Field(default_factory=list)
    """stdio: its arguments."""
    env: dict[str, str] = Field(default_factory=dict)
    """stdio: its environment besides PATH, HOME and LANG, which it gets from the service's
    (those set there; an entry here wins). Nothing else of the service's environment is
    passed on unless named here; a value `${NAME}` is the service's variable NAME."""
    cwd: Path | None = None
    """stdio: its working directory (default: the service's)."""
    url: str | None = None
    """Streamable HTTP: the endpoint, e.g. `https://tools.example.com/mcp`."""
    headers: dict[str, str] = Field(default_factory=dict)
    """Streamable HTTP: headers of every request; a value may hold `${NAME}`, replaced at
    start-up by the service's variable NAME (a secret stays out of the config file)."""
    tool_timeout_s: float | None = Field(None, gt=0)
    """Hard timeout of one call to a tool of this server; the agent's
    `limits.tool_timeout_s` when it is shorter or this is unset. A call cut off by it is
    cancelled on the server (notifications/cancelled)."""
    allowed_tools: list[str] | None = None
    """Only these of the server's tools are used (by their MCP name); unset: all."""
    blocked_tools: list[str] = Field(default_factory=list)
    """These of the server's tools are never used."""
    needs_approval: bool | list[str] = False
    """Calls of the server's tools wait for a person's decision before they run: true for
    every tool, or a list of its tools (by their MCP name). Whichever agent offers them."""
    connect_timeout_s: float = Field(10.0, gt=0)
    """How long one attempt to connect (start, initialize, list the tools) may take; start-up
    waits at most this long for every server before serving without those not yet up."""
    ping_interval_s: float = Field(15.0, gt=0)
    """How often an idle connection is checked with an MCP ping: how soon a Streamable HTTP
    server that went away, or a stdio server that hangs, loses its tools. (A stdio server
    whose process exits loses them at once.)"""

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError(f"mcp server {self.name!r}: set exactly one of command and url")
        if self.url is None and self.headers:
            raise ValueError(f"mcp server {self.name!r}: headers are for a url server")
        if self.command is None and (self.args or self.env or self.cwd):
            raise ValueError(f"mcp server {self.name!r}: args, env and cwd are for a command")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"mcp server {self.name!r}: url must be http:// or https://")
        return self

    @property
    def transport(self) -> Literal["stdio", "streamable-http"]:
        return "stdio" if self.command is not None else "streamable-http"


def approval_tools(agent: AgentConfig, servers: list[McpServerConfig]) -> list[str]:
    """The tools (config names: `server.tool` for an MCP one) whose calls wait for approval
    in `agent`'s runs: its `needs_approval` tools, and the tools MCP servers list in theirs
    (a server's `needs_approval: true` covers all of its tools: `AgentSpec.approval_servers`)."""
    listed = [
        f"{server.name}.{tool}"
        for server in servers
        if isinstance(server.needs_approval, list)
        for tool in server.needs_approval
    ]
    return agent.approval_tools() + listed


class HooksConfig(_Strict):
    """Python callables (`package.module:function`) called at points of every run."""

    on_run_start: list[str] = Field(default_factory=list)
    before_model_call: list[str] = Field(default_factory=list)
    after_step: list[str] = Field(default_factory=list)
    on_run_end: list[str] = Field(default_factory=list)


class RequestLimitsConfig(_Strict):
    """How large the parts of a request may be; a request over any of them is refused with
    INVALID_ARGUMENT naming the field. Sizes are UTF-8 bytes."""

    max_input_bytes: int = Field(1 * MIB, ge=1)
    """`RunRequest.input`, the user message."""
    max_instructions_bytes: int = Field(256 * KIB, ge=1)
    """`RunOverrides.instructions`, the run's system prompt."""
    max_metadata_entries: int = Field(64, ge=0)
    """Entries of `RunRequest.metadata`."""
    max_metadata_key_bytes: int = Field(128, ge=1)
    max_metadata_value_bytes: int = Field(4 * KIB, ge=1)
    max_client_tools: int = Field(128, ge=0)
    """Entries of `RunRequest.client_tools`."""
    max_tool_description_bytes: int = Field(16 * KIB, ge=1)
    """A client tool's `description`."""
    max_tool_schema_bytes: int = Field(64 * KIB, ge=2)
    """A client tool's `parameters_json` (its JSON Schema as text)."""
    max_tool_schema_depth: int = Field(32, ge=1, le=64)
    """How deeply a client tool's JSON Schema may nest objects and arrays (the top level is
    1). Bounded so checking and encoding the schema never runs out of stack."""
    max_tool_schema_objects: int = Field(2048, ge=1)
    """JSON objects (subschemas and property maps) in all client tool schemas of one request
    together. Checking a schema against the JSON Schema metaschema costs up to about half a
    millisecond per object, so this bounds what one request can cost."""
    max_tool_output_bytes: int = Field(1 * MIB, ge=1)
    """Each `SubmitToolOutputsRequest.tool_outputs[].output`."""


def check_host_port(value: str) -> str:
    """`value` if it is `host:port` with a port in 0..65535, else ValueError."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError("must be host:port with a port in 0..65535")
    return value


class ServerConfig(_Strict):
    """gRPC server tuning."""

    workers: int = Field(1, ge=1, le=MAX_WORKERS)
    """How many worker processes serve the listen address (`auto`: one per available core).
    1 is one process, as ever; more start a supervisor that spawns them, each a full
    server sharing the port (SO_REUSEPORT), restarts one that dies and drains them all on
    SIGTERM (docs/deploy.md). `agio-grpc serve --workers N` sets it too."""

    grace_period_s: float = Field(10.0, ge=0)
    """On SIGTERM: how long running calls may finish before they are cancelled."""
    max_message_bytes: int = Field(16 * 1024 * 1024, ge=1024)
    """Send and receive limit per message."""
    max_concurrent_rpcs: int | None = Field(None, ge=1)
    """Calls beyond this are refused with RESOURCE_EXHAUSTED (None: no limit)."""
    keepalive_time_s: float = Field(30.0, gt=0)
    """Ping an idle connection this often."""
    keepalive_timeout_s: float = Field(10.0, gt=0)
    """Close a connection whose ping is not answered in this time."""
    min_client_ping_interval_s: float = Field(10.0, gt=0)
    """Clients pinging more often than this are told off (GOAWAY too_many_pings)."""
    max_connection_idle_s: float = Field(3600.0, gt=0)
    """Close connections idle this long."""
    max_pending_calls: int = Field(100_000, ge=1)
    """How many arrived calls may wait for the server to pick them up; gRPC refuses more with
    a bare CANCELLED (its own defaults, 1,000 and 3,000, did so to ~10% of a burst of 2,000
    calls). To shed load with a typed status instead, set `max_concurrent_rpcs`."""
    max_call_queue_time_s: int = Field(3600, ge=1)
    """How long an arrived call may wait for the server to pick it up before gRPC cancels it.
    gRPC's own default is 30 s, after which a call queued behind a busy event loop ends with
    a bare CANCELLED; this long, the caller's deadline decides instead. To shed load
    explicitly, set `max_concurrent_rpcs` (RESOURCE_EXHAUSTED)."""
    session_lease_s: float = Field(30.0, gt=0)
    """How long a run holds its session without renewal (renewed every third of it): after a
    crash, the session is taken over by the next run this long after the last renewal."""
    instance_id: str = Field("", max_length=256)
    """This server's name on the sessions its runs hold, stable across its restarts: a
    server starting ends at once (INTERRUPTED, retryable) the runs it left, instead of after
    their lease. "" = `HOST:PORT` of the listen address (the host's name for a wildcard or
    loopback address). Two live servers must never share one."""
    member_address: str = "127.0.0.1:0"
    """Where this server takes calls from the other servers sharing its database (its
    members): a `WatchRun` sent to another member follows the run's events live from the
    server running it, and a `CancelRun` sent elsewhere reaches that server at once
    (docs/deploy.md). `host:port`, port 0 = any free one. Loopback by default, which serves
    the members of one host (the workers of `serve --workers N`, servers sharing a SQLite
    file); servers on several hosts bind an address the others reach, on a private network
    (the member listener speaks plaintext, and each call carries a token every member reads
    from the database)."""
    member_advertise_address: str = ""
    """The `host:port` the other members call ("" = the bound member address; when that is a
    wildcard such as `0.0.0.0`, this host's name with the bound port)."""
    max_running_runs: int = Field(512, ge=0)
    """How many runs this server runs at once (0: no limit). A run asked for beyond it
    waits for one to end, in arrival order, for at most the shorter of half the time to its
    caller's deadline and `admission_wait_s`, then is refused with
    RESOURCE_EXHAUSTED `SERVER_BUSY` (retry later or elsewhere). Without a limit, a burst
    past the server's capacity slows every run alike until none meets its deadline."""
    admission_wait_s: float = Field(30.0, ge=0)
    """The longest a run waits for a free slot, with a deadline (if half the time to it is
    longer) or without one."""
    max_queued_runs: int = Field(10, ge=0)
    """How many runs may wait in one session's queue (BUSY_POLICY_ENQUEUE, INTERRUPT,
    ROLLBACK); one more is refused with RESOURCE_EXHAUSTED `QUEUE_FULL`."""
    history_cache_mb: float = Field(64.0, ge=0)
    """How much memory (an estimate: each step's texts plus about half a kilobyte) recent
    sessions' histories may take between runs, so a new run on one of them reads only the
    steps stored since (checked against the store in the run's start transaction). 0 turns
    it off: every run reads its whole history."""
    max_run_timeout_s: float = Field(24 * 3600.0, gt=0)
    """The longest run timeout an agent's `limits.run_timeout_s` or a run's
    `overrides.timeout` may ask for; a longer override is refused with INVALID_ARGUMENT."""
    request_limits: RequestLimitsConfig = Field(default_factory=RequestLimitsConfig)
    """Sizes of requests (input, instructions, metadata, client tools, tool outputs)."""
    reflection: bool | None = None
    """Serve gRPC server reflection (grpcurl, ghz without .proto files). Unset: on when
    `auth.mode` is `none`, off otherwise. Reflection, like health checking, answers without
    a credential: it describes the contract, never a tenant's data."""

    @field_validator("workers", mode="before")
    @classmethod
    def _workers_or_auto(cls, value: object) -> object:
        return parse_workers(value)

    @field_validator("member_address", "member_advertise_address")
    @classmethod
    def _check_member_addresses(cls, value: str, info: ValidationInfo) -> str:
        unset = not value and info.field_name == "member_advertise_address"
        return value if unset else check_host_port(value)


AuthMode = Literal["none", "api_key", "jwt", "mtls"]

JWT_ALGORITHMS = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
"""The algorithms `auth.jwt.algorithms` may name: signatures checked with a public key only
(an HMAC secret shared with the issuer, or `none`, are refused)."""


class ApiKeyAuthConfig(_Strict):
    """`auth.mode: api_key`: keys made with `agio-grpc keys create`, kept in the store."""

    cache_s: float = Field(5.0, ge=0)
    """How long a verified key is remembered before the store is asked again: a revoked key
    is refused at most this long after `agio-grpc keys revoke` (0: every call asks)."""


class JwtAuthConfig(_Strict):
    """`auth.mode: jwt`: bearer tokens signed by an identity provider."""

    jwks_url: str | None = None
    """The provider's JSON Web Key Set (`https://issuer/.well-known/jwks.json`); fetched
    without blocking, kept `jwks_cache_s`, fetched again for a key id it does not hold.
    Exactly one of `jwks_url` and `public_key_file`."""
    public_key_file: Path | None = None
    """A PEM public key that verifies every token (read once, at start)."""
    issuer: str | None = None
    """The `iss` every token must carry (required)."""
    audience: str | None = None
    """The `aud` every token must carry (required): this service's name at the provider."""
    tenant_claim: str = Field("tenant", min_length=1)
    """The claim naming the caller's tenant; a token without it is in the tenant of its
    `sub`."""
    algorithms: list[str] | None = Field(None, min_length=1)
    """The signature algorithms accepted (public-key ones only), of those the key fits: a
    token signed with another is refused. Unset: every algorithm of the key's type (an RSA
    key: RS256, RS384, RS512, PS256, PS384, PS512; an EC key: the ES* of its curve; an
    Ed25519 or Ed448 key: EdDSA; a key of the set: the algorithm it is published for)."""
    leeway_s: float = Field(30.0, ge=0, le=600)
    """Clock difference allowed when checking `exp`, `nbf` and `iat`."""
    jwks_cache_s: float = Field(300.0, gt=0)
    """How long a fetched key set is used before it is fetched again (a key the provider
    withdrew is refused at most this long after)."""
    jwks_refresh_min_interval_s: float = Field(30.0, ge=0)
    """A token naming a key id the set does not hold fetches the set again, at most this
    often (tokens with made-up key ids cannot make the server hammer the provider)."""
    jwks_timeout_s: float = Field(5.0, gt=0)
    """How long one fetch of the key set may take."""
    cache_s: float = Field(60.0, ge=0)
    """How long a verified token is remembered (never past its `exp`), so that a client
    sending the same token with every call pays for its signature check once (about
    0.3 ms of CPU for RS256). 0: every call checks it."""

    @field_validator("algorithms")
    @classmethod
    def _public_key_algorithms(cls, value: list[str] | None) -> list[str] | None:
        refused = [name for name in value or () if name not in JWT_ALGORITHMS]
        if refused:
            raise ValueError(
                f"{', '.join(map(repr, refused))} not accepted: use public-key algorithms "
                f"({', '.join(sorted(JWT_ALGORITHMS))})"
            )
        return value

    def problems(self) -> list[str]:
        """What keeps this section from verifying tokens (`auth.mode: jwt`)."""
        found = []
        if (self.jwks_url is None) == (self.public_key_file is None):
            found.append("set exactly one of auth.jwt.jwks_url and auth.jwt.public_key_file")
        if not self.issuer:
            found.append("auth.jwt.issuer is required")
        if not self.audience:
            found.append("auth.jwt.audience is required")
        return found


class MtlsAuthConfig(_Strict):
    """`auth.mode: mtls`: the tenant is named by the client's certificate, which the TLS
    transport has verified against the client CA."""

    tenant_from: Literal["cn", "san_uri"] = "cn"
    """`cn`: the certificate's subject common name. `san_uri`: a URI subject alternative
    name starting with `san_uri_prefix`, less the prefix (SPIFFE IDs, say)."""
    san_uri_prefix: str = ""
    """With `tenant_from: san_uri`: e.g. `spiffe://example.org/tenant/` (the tenant is the
    rest of the URI); "" takes the first URI whole."""


class AuthConfig(_Strict):
    """Who may call (`AGIO_AUTH`): every `agio.v1` call carries a credential, checked at the
    edge, which names the caller's tenant. Health checking and reflection need none."""

    mode: AuthMode | None = None
    """`none` (every caller in one default tenant), `api_key`, `jwt` or `mtls`. Unset:
    `none` when the server listens on a loopback address; elsewhere it refuses to start."""
    api_key: ApiKeyAuthConfig = Field(default_factory=ApiKeyAuthConfig)
    jwt: JwtAuthConfig = Field(default_factory=JwtAuthConfig)
    mtls: MtlsAuthConfig = Field(default_factory=MtlsAuthConfig)

    @model_validator(mode="after")
    def _mode_is_complete(self) -> AuthConfig:
        if self.mode == "jwt" and self.jwt.problems():
            raise ValueError("auth.mode jwt: " + "; ".join(self.jwt.problems()))
        if self.mode == "mtls" and self.mtls.san_uri_prefix and self.mtls.tenant_from != "san_uri":
            raise ValueError("auth.mtls.san_uri_prefix needs auth.mtls.tenant_from: san_uri")
        return self


class QuotasConfig(_Strict):
    """What each tenant may use at once, over every server sharing the database (0: no
    limit). A run past a quota is refused with RESOURCE_EXHAUSTED `TENANT_QUOTA_EXCEEDED`
    (a `google.rpc.QuotaFailure` naming `tenant:<id>`, and a `google.rpc.RetryInfo`);
    nothing is stored."""

    max_running_runs_per_tenant: int = Field(0, ge=0)
    """How many of a tenant's runs may be RUNNING: a Run, StartRun, Retry or
    SubmitToolOutputs that would run one more is refused. A run queued before starts
    whatever the count (it was accepted when it was queued)."""
    max_queued_runs_per_tenant: int = Field(0, ge=0)
    """How many of a tenant's runs may wait QUEUED (BUSY_POLICY_ENQUEUE, INTERRUPT,
    ROLLBACK), over all its sessions; `server.max_queued_runs` bounds each session's."""


def check_host_pattern(value: str) -> str:
    """An `http.allowed_hosts` entry, lowercased: a host name, `*.` and a domain, or `*`."""
    pattern = value.strip().lower()
    if pattern.endswith(".") and pattern != "*.":  # a fully qualified name's root
        pattern = pattern[:-1]
    name = pattern.removeprefix("*.")
    if pattern != "*" and (
        not name or any(not part or not part.replace("-", "").isalnum() for part in name.split("."))
    ):
        raise ValueError(
            f"{value!r} is not a host name: give a name without scheme or port "
            "(agio.example.com), *.example.com for the names under a domain, or *"
        )
    return pattern


class HttpConfig(_Strict):
    """The HTTP listener (`http_address`): the same services over Connect and gRPC-Web, for
    browsers and HTTP clients (docs/browsers.md)."""

    allowed_origins: list[str] = Field(default_factory=list)
    """Origins of the web pages that may call (`https://app.example.com`; `*`: any page).
    Empty: only pages of the listener's own origin; clients that are not browsers send no
    origin and are not concerned."""
    allowed_hosts: list[str] = Field(default_factory=list)
    """Host names, besides the listener's own, that a request's `Host` may name: the names
    clients reach it by (`agio.example.com`; `*.example.com`: any name under it; `*`: any
    name). The listener's own: any IP address, its bound host, the hosts of
    `listen_address` and `server.member_advertise_address`, the machine's name when it
    listens on every interface, and `localhost` when it listens on loopback or every
    interface. A request naming another host is refused 403 `HOST_NOT_ALLOWED` before any
    handler: a page whose name was made to resolve to this server (DNS rebinding) names
    its own name, and would pass for the listener's own origin."""
    keep_alive_s: int = Field(5, ge=1)
    """How long an idle HTTP/1.1 connection is kept open."""
    console: bool = True
    """Serve the run console at `/` (docs/browsers.md)."""

    @field_validator("allowed_hosts")
    @classmethod
    def _host_patterns(cls, value: list[str]) -> list[str]:
        return [check_host_pattern(entry) for entry in value]

    trace_url_template: str = ""
    """The console's link to a step's trace, `{trace_id}` replaced: e.g.
    `http://127.0.0.1:16686/trace/{trace_id}` (Jaeger). "": no link."""


class Settings(BaseSettings):
    """Everything `agio-grpc serve` needs. Environment variables win over the config file."""

    model_config = SettingsConfigDict(
        env_prefix="AGIO_", env_nested_delimiter="__", extra="forbid", populate_by_name=True
    )

    listen_address: str = "127.0.0.1:50051"
    """host:port to listen on; port 0 picks a free port (the bound one is logged)."""
    http_address: str | None = None
    """host:port of the HTTP listener (Connect and gRPC-Web, `http`); unset: none."""
    http: HttpConfig = Field(default_factory=HttpConfig)
    database_url: str = "sqlite+aiosqlite:///agio.db"
    """SQLAlchemy URL: `sqlite+aiosqlite:///file.db` or `postgresql+asyncpg://...`."""
    config: Path | None = None
    """The YAML config file (AGIO_CONFIG)."""
    openai_base_url: str | None = Field(
        None, validation_alias=AliasChoices("OPENAI_BASE_URL", "openai_base_url")
    )
    """The model endpoint; unset runs the built-in fake model."""
    openai_api_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("OPENAI_API_KEY", "openai_api_key")
    )
    sqlite_synchronous: Literal["NORMAL", "FULL"] = "NORMAL"
    """SQLite durability: NORMAL survives process crashes, FULL also machine crashes."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    default_agent: str = "assistant"
    agents: list[AgentConfig] = Field(default_factory=lambda: [AgentConfig(name="assistant")])
    tool_modules: list[str] = Field(default_factory=list)
    """Extra tools: `package.module:function`, or `package.module` exporting `TOOLS`."""
    mcp_servers: list[McpServerConfig] = Field(default_factory=list)
    """MCP servers whose tools agents offer (docs/tools.md)."""
    hooks: HooksConfig = Field(default_factory=HooksConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    auth: AuthConfig = Field(default_factory=AuthConfig)
    """Authentication (`AGIO_AUTH=api_key` is short for `AGIO_AUTH__MODE=api_key`)."""
    tls_cert_file: Path | None = None
    """PEM certificate chain the server presents (its own certificate first, then the
    intermediates). With `tls_key_file` the server speaks TLS only; both are re-read on
    SIGHUP, and new connections get the new certificate (docs/tls.md)."""
    tls_key_file: Path | None = Field(None, validate_default=True)
    """The unencrypted PEM private key of `tls_cert_file`."""
    tls_client_ca_file: Path | None = None
    """PEM certificates of the CAs that sign client certificates: set, every client must
    present one they signed (mutual TLS). Needs `tls_cert_file` and `tls_key_file`."""
    quotas: QuotasConfig = Field(default_factory=QuotasConfig)

    @field_validator("listen_address", "http_address")
    @classmethod
    def _check_address(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None or (value == "" and info.field_name == "http_address"):
            return None  # AGIO_HTTP_ADDRESS= turns the HTTP listener off
        return check_host_port(value)

    @field_validator("tls_key_file")
    @classmethod
    def _key_with_certificate(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        has_certificate = info.data.get("tls_cert_file") is not None
        if has_certificate and value is None:
            raise ValueError("tls_cert_file is set: set this to its private key (or unset both)")
        if value is not None and not has_certificate:
            raise ValueError("set tls_cert_file to the certificate of this key (or unset both)")
        return value

    @field_validator("tls_client_ca_file")
    @classmethod
    def _client_ca_with_certificate(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is not None and info.data.get("tls_cert_file") is None:
            raise ValueError("mutual TLS needs the server's own tls_cert_file and tls_key_file")
        return value

    @field_validator("agents")
    @classmethod
    def _unique_agents(cls, value: list[AgentConfig]) -> list[AgentConfig]:
        names = [agent.name for agent in value]
        if len(set(names)) != len(names):
            raise ValueError("agent names must be unique")
        if not names:
            raise ValueError("at least one agent is required")
        return value

    @model_validator(mode="after")
    def _agents_name_known_mcp_servers(self) -> Settings:
        names = [server.name for server in self.mcp_servers]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"mcp_servers: duplicate names {', '.join(duplicates)}")
        for agent in self.agents:
            named = [*agent.mcp, *(tool.partition(".")[0] for tool in agent.tools if "." in tool)]
            unknown = sorted({name for name in named if name not in names})
            if unknown:
                raise ValueError(
                    f"agent {agent.name!r} names unknown mcp servers {', '.join(unknown)}; "
                    f"mcp_servers: {', '.join(names) or '(none)'}"
                )
        return self

    @model_validator(mode="after")
    def _default_agent_exists(self) -> Settings:
        if self.default_agent not in {agent.name for agent in self.agents}:
            raise ValueError(f"default_agent {self.default_agent!r} is not among the agents")
        return self

    @model_validator(mode="after")
    def _mtls_has_client_certificates(self) -> Settings:
        if self.auth.mode == "mtls" and self.tls_client_ca_file is None:
            raise ValueError(
                "auth.mode mtls takes the tenant from the client certificate: set "
                "AGIO_TLS_CLIENT_CA_FILE (with AGIO_TLS_CERT_FILE and AGIO_TLS_KEY_FILE) so "
                "that clients must present one"
            )
        return self

    @model_validator(mode="after")
    def _run_timeouts_within_maximum(self) -> Settings:
        longest = self.server.max_run_timeout_s
        largest_step = self.server.max_message_bytes // 2
        for agent in self.agents:
            if agent.limits.run_timeout_s > longest:
                raise ValueError(
                    f"agent {agent.name!r}: limits.run_timeout_s {agent.limits.run_timeout_s} "
                    f"is above server.max_run_timeout_s {longest}"
                )
            if agent.limits.max_step_bytes > largest_step:
                raise ValueError(
                    f"agent {agent.name!r}: limits.max_step_bytes {agent.limits.max_step_bytes} "
                    f"is above half of server.max_message_bytes ({largest_step})"
                )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, _EnvSource(settings_cls)]
        path = os.environ.get("AGIO_CONFIG")
        if path:
            if not Path(path).is_file():
                raise FileNotFoundError(f"AGIO_CONFIG names {path!r}, which is not a file")
            sources.append(_YamlFileSource(settings_cls, yaml_file=path))
        return tuple(sources)


class ConfigFileError(ValueError):
    """The config file cannot be read as a YAML mapping; the message names the file (and
    the line and column of a YAML error) in one line."""


class _YamlFileSource(YamlConfigSettingsSource):
    """The YAML config file, whose reading errors are ConfigFileError, not a parser's
    traceback."""

    def _read_file(self, file_path: Path | Traversable) -> dict[str, Any]:
        where = f"the config file {file_path} (AGIO_CONFIG)"
        try:
            text = file_path.read_bytes().decode("utf-8")
        except OSError as error:
            raise ConfigFileError(f"cannot read {where}: {error.strerror}") from None
        except UnicodeDecodeError as error:
            raise ConfigFileError(
                f"{where} is not UTF-8 text: byte {error.start} is {error.object[error.start]:#04x}"
            ) from None
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as error:
            raise ConfigFileError(f"{where} is not valid YAML: {_yaml_problem(error)}") from None
        if loaded is None:
            return {}  # an empty file: nothing set
        if not isinstance(loaded, dict):
            raise ConfigFileError(
                f"{where} must be a YAML mapping of settings (`agents:`, `server:`, ...), "
                f"not {_YAML_KINDS.get(type(loaded), 'a single value')}"
            )
        return loaded


_YAML_KINDS = {list: "a list", str: "a string", int: "a number", float: "a number"}


def _yaml_problem(error: yaml.YAMLError) -> str:
    """What the YAML parser found wrong, and where (lines and columns from 1)."""
    if not isinstance(error, yaml.MarkedYAMLError):
        return " ".join(str(error).split())
    problem = error.problem or error.context or "malformed"
    mark = error.problem_mark or error.context_mark
    text = f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem
    context = error.context_mark
    if error.context and error.problem and context is not None and context is not mark:
        text += f" ({error.context} at line {context.line + 1}, column {context.column + 1})"
    return text


def model_key_warning(settings: Settings) -> str | None:
    """The start-up warning for a model endpoint set without OPENAI_API_KEY, whose calls
    would carry a placeholder key (a provider answers 401 "Incorrect API key"). None with a
    key, the built-in fake model, or an endpoint on this machine (Ollama, vLLM, llama.cpp
    there usually take no key)."""
    url = settings.openai_base_url
    if url is None or settings.openai_api_key is not None:
        return None
    parts = urlsplit(url)
    host = parts.hostname or ""
    if _is_loopback(host):
        return None
    shown = f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")
    return (
        f"OPENAI_BASE_URL is set ({shown}) but OPENAI_API_KEY is not: model calls carry the "
        "placeholder key `unused`, which a provider refuses (401 Incorrect API key); set "
        "OPENAI_API_KEY"
    )


def _is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _EnvSource(EnvSettingsSource):
    """The environment, where `AGIO_AUTH` may be a bare mode (`AGIO_AUTH=api_key`) rather
    than the JSON object a section variable holds; `AGIO_AUTH__JWT__ISSUER` and the like
    add to it as to any section."""

    def prepare_field_value(
        self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool
    ) -> Any:
        if field_name == "auth" and isinstance(value, str) and not value.lstrip().startswith("{"):
            value = json.dumps({"mode": value.strip()})
        return super().prepare_field_value(field_name, field, value, value_is_complex)
