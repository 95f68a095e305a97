"""The agent engine: the run loop, the model port, tools, context building and run events.

Pure asyncio. Never imports grpc, protobuf, SQLAlchemy, OpenTelemetry, the service layer or
the SQL store: it speaks the domain types and the store's role protocols only
(agio_grpc.store). The service layer drives it through `Runtime`.
"""

from agio_grpc.engine.agents import (
    AgentSpec,
    ClientTool,
    Limits,
    RunInput,
    RunOverrides,
    RunSettings,
    ToolOutput,
)
from agio_grpc.engine.builtin_tools import TOOLS as BUILTIN_TOOLS
from agio_grpc.engine.channel import RunChannel
from agio_grpc.engine.errors import (
    AgentNotFoundError,
    EngineError,
    InvalidInputError,
    RunStateError,
    RuntimeClosedError,
    ServerBusyError,
)
from agio_grpc.engine.events import (
    ErrorNotice,
    Event,
    RunCompleted,
    RunFailed,
    RunStarted,
    SequencedEvent,
    StepCompleted,
    StepDelta,
    StepStarted,
    ToolCallDelta,
    ToolProgress,
)
from agio_grpc.engine.hooks import Hooks, StopRun
from agio_grpc.engine.models import ModelDriver
from agio_grpc.engine.models.retries import RetryPolicy
from agio_grpc.engine.options import RuntimeOptions
from agio_grpc.engine.runtime import Runtime
from agio_grpc.engine.segments import RunHandle
from agio_grpc.engine.tools import Tool, ToolContext, ToolRegistry, ToolStop, load_tools
from agio_grpc.engine.tracing import NO_TRACER, RunTrace, RunTracer

__all__ = [
    "BUILTIN_TOOLS",
    "NO_TRACER",
    "AgentNotFoundError",
    "AgentSpec",
    "ClientTool",
    "EngineError",
    "ErrorNotice",
    "Event",
    "Hooks",
    "InvalidInputError",
    "Limits",
    "ModelDriver",
    "RetryPolicy",
    "RunChannel",
    "RunCompleted",
    "RunFailed",
    "RunHandle",
    "RunInput",
    "RunOverrides",
    "RunSettings",
    "RunStarted",
    "RunStateError",
    "RunTrace",
    "RunTracer",
    "Runtime",
    "RuntimeClosedError",
    "RuntimeOptions",
    "SequencedEvent",
    "ServerBusyError",
    "StepCompleted",
    "StepDelta",
    "StepStarted",
    "StopRun",
    "Tool",
    "ToolCallDelta",
    "ToolContext",
    "ToolOutput",
    "ToolProgress",
    "ToolRegistry",
    "ToolStop",
    "load_tools",
]
