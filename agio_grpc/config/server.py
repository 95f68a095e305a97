"""The server's own settings: listening, request limits, workers and members, authentication,
quotas and the HTTP listener."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import (
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from agio_grpc.config.base import KIB, MAX_WORKERS, MIB, Strict, parse_workers


class RequestLimitsConfig(Strict):
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


class ServerConfig(Strict):
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
    max_agent_depth: int = Field(3, ge=1, le=16)
    """How deep local agents called as tools (`agents:`) nest: a run started by a tool call
    is one deeper than its caller, and a call beyond this depth is an error the model sees."""
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


class ApiKeyAuthConfig(Strict):
    """`auth.mode: api_key`: keys made with `agio-grpc keys create`, kept in the store."""

    cache_s: float = Field(5.0, ge=0)
    """How long a verified key is remembered before the store is asked again: a revoked key
    is refused at most this long after `agio-grpc keys revoke` (0: every call asks)."""


class JwtAuthConfig(Strict):
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


class MtlsAuthConfig(Strict):
    """`auth.mode: mtls`: the tenant is named by the client's certificate, which the TLS
    transport has verified against the client CA."""

    tenant_from: Literal["cn", "san_uri"] = "cn"
    """`cn`: the certificate's subject common name. `san_uri`: a URI subject alternative
    name starting with `san_uri_prefix`, less the prefix (SPIFFE IDs, say)."""
    san_uri_prefix: str = ""
    """With `tenant_from: san_uri`: e.g. `spiffe://example.org/tenant/` (the tenant is the
    rest of the URI); "" takes the first URI whole."""


class AuthConfig(Strict):
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


class QuotasConfig(Strict):
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


class HttpConfig(Strict):
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


class A2AConfig(Strict):
    """A2A push notifications (docs/a2a.md)."""

    push_allow_private_hosts: bool = False
    """Whether a push notification URL may name a loopback, private, link-local or other
    internal address (refused by default: a caller must not make the server reach inside
    its network)."""
    push_max_attempts: int = Field(4, ge=1, le=20)
    """Attempts per notification: a network error, a 408, 429 or 5xx is tried again, after
    0.5 s, then doubling (at most 30 s)."""
    push_timeout_s: float = Field(10.0, gt=0, le=300)
    """How long one POST may take."""
