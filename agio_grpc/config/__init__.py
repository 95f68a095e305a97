"""Settings of `agio-grpc serve`: environment variables over an optional YAML file.

Names and defaults follow DESIGN.md section 7. `AGIO_CONFIG` names the file; every other
variable wins over the file. The file also holds what does not fit in a variable: agents,
tool modules, hooks and server tuning. Never imports grpc or the engine.

The parts: base.py (shared limits and the strict model), agents.py (agents, MCP servers,
hooks), server.py (listening, limits, workers, authentication, quotas, HTTP); this module
reads them from the file and the environment (`Settings`).
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

from agio_grpc.config.agents import (
    A2AAgentConfig,
    AgentConfig,
    CompactionConfig,
    HooksConfig,
    LimitsConfig,
    McpServerConfig,
    ToolOptionsConfig,
    approval_tools,
)
from agio_grpc.config.base import (
    DEFAULT_INSTRUCTIONS,
    KIB,
    MAX_STEPS_LIMIT,
    MAX_WORKERS,
    MIB,
    Strict,
    available_cores,
    parse_workers,
)
from agio_grpc.config.server import (
    JWT_ALGORITHMS,
    A2AConfig,
    ApiKeyAuthConfig,
    AuthConfig,
    AuthMode,
    HttpConfig,
    JwtAuthConfig,
    MtlsAuthConfig,
    QuotasConfig,
    RequestLimitsConfig,
    ServerConfig,
    check_host_pattern,
    check_host_port,
)

__all__ = [
    "DEFAULT_INSTRUCTIONS",
    "JWT_ALGORITHMS",
    "KIB",
    "MAX_STEPS_LIMIT",
    "MAX_WORKERS",
    "MIB",
    "A2AAgentConfig",
    "A2AConfig",
    "AgentConfig",
    "ApiKeyAuthConfig",
    "AuthConfig",
    "AuthMode",
    "CompactionConfig",
    "ConfigFileError",
    "HooksConfig",
    "HttpConfig",
    "JwtAuthConfig",
    "LimitsConfig",
    "McpServerConfig",
    "MtlsAuthConfig",
    "QuotasConfig",
    "RequestLimitsConfig",
    "ServerConfig",
    "Settings",
    "Strict",
    "ToolOptionsConfig",
    "approval_tools",
    "available_cores",
    "check_host_pattern",
    "check_host_port",
    "model_key_warning",
    "parse_workers",
]


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
    database_pool_size: int = Field(20, ge=1, le=1000)
    """PostgreSQL connections each server process keeps open once it needed them (10 more
    open for bursts and close again; store/database.py); SQLite ignores it."""
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
    a2a: A2AConfig = Field(default_factory=A2AConfig)
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
