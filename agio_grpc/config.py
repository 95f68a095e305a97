"""Settings of `agio-grpc serve`: environment variables over an optional YAML file.

Names and defaults follow DESIGN.md section 7. `AGIO_CONFIG` names the file; every other
variable wins over the file. The file also holds what does not fit in a variable: agents,
tool modules, hooks and server tuning. Never imports grpc or the engine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
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


class AgentConfig(_Strict):
    """A named agent: model, instructions, tools and limits."""

    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$")
    model: str = "fake-model"
    """The model name sent to the endpoint."""
    instructions: str = DEFAULT_INSTRUCTIONS
    """The system prompt."""
    tools: list[str] = Field(default_factory=lambda: ["current_time", "calculate"])
    """Names of registered tools the agent offers."""
    tool_options: dict[str, ToolOptionsConfig] = Field(default_factory=dict)
    """Per tool of `tools` (by name): how the agent runs it. A tool not named here gets the
    defaults (`on_error: continue`)."""
    temperature: float | None = Field(None, ge=0, le=2)
    max_tokens: int | None = Field(None, ge=1)
    """Completion token cap per model call."""
    limits: LimitsConfig = Field(default_factory=LimitsConfig)

    @model_validator(mode="after")
    def _options_name_its_tools(self) -> AgentConfig:
        strangers = [name for name in self.tool_options if name not in self.tools]
        if strangers:
            raise ValueError(
                f"tool_options names {', '.join(map(repr, strangers))}, not among the "
                f"agent's tools ({', '.join(self.tools) or 'none'})"
            )
        return self

    def stop_on_error_tools(self) -> list[str]:
        """The tools whose error result ends the run (`on_error: stop`), in `tools` order."""
        return [
            name
            for name in self.tools
            if name in self.tool_options and self.tool_options[name].on_error == "stop"
        ]


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


class ServerConfig(_Strict):
    """gRPC server tuning."""

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
    max_running_runs: int = Field(512, ge=0)
    """How many runs this server runs at once (0: no limit). A run asked for beyond it
    waits for one to end, in arrival order, for at most half the time to its caller's
    deadline (`admission_wait_s` without one), then is refused with
    RESOURCE_EXHAUSTED `SERVER_BUSY` (retry later or elsewhere). Without a limit, a burst
    past the server's capacity slows every run alike until none meets its deadline."""
    admission_wait_s: float = Field(30.0, ge=0)
    """How long a run asked for without a deadline waits for a free slot."""
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


class Settings(BaseSettings):
    """Everything `agio-grpc serve` needs. Environment variables win over the config file."""

    model_config = SettingsConfigDict(
        env_prefix="AGIO_", env_nested_delimiter="__", extra="forbid", populate_by_name=True
    )

    listen_address: str = "127.0.0.1:50051"
    """host:port to listen on; port 0 picks a free port (the bound one is logged)."""
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
    hooks: HooksConfig = Field(default_factory=HooksConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    quotas: QuotasConfig = Field(default_factory=QuotasConfig)

    @field_validator("listen_address")
    @classmethod
    def _check_address(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValueError("must be host:port with a port in 0..65535")
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
    def _default_agent_exists(self) -> Settings:
        if self.default_agent not in {agent.name for agent in self.agents}:
            raise ValueError(f"default_agent {self.default_agent!r} is not among the agents")
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
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        path = os.environ.get("AGIO_CONFIG")
        if path:
            if not Path(path).is_file():
                raise FileNotFoundError(f"AGIO_CONFIG names {path!r}, which is not a file")
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=path))
        return tuple(sources)
