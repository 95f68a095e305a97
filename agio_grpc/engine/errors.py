"""Errors the engine raises for requests it refuses before any run starts.

Outcomes of a run are never exceptions: they are StopSignals. These exceptions are for calls
that cannot be served (bad input, unknown agent, wrong run state); the service layer maps
each to one gRPC status. Store errors (`NotFoundError`, `SessionBusyError`,
`DuplicateRequestError`, ...) propagate as they are. Never imports grpc.
"""

from __future__ import annotations

from agio_grpc.domain import Run, RunStatus


class EngineError(Exception):
    """Base of the engine's request errors."""


class AgentNotFoundError(EngineError):
    """The request names an agent the server does not define."""

    def __init__(self, agent: str, known: list[str]) -> None:
        super().__init__(f"agent {agent!r} not found; known agents: {', '.join(sorted(known))}")
        self.agent = agent
        self.known = known


class InvalidInputError(EngineError):
    """A request field is invalid; `field` names it (e.g. `input`, `tool_outputs`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class RunStateError(EngineError):
    """The run is not in a state that allows the operation (e.g. submit to a finished run)."""

    def __init__(self, run_id: str, status: str, message: str) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.status = status

    @classmethod
    def unless_waiting(cls, run: Run) -> Run:
        """`run`, when it waits for its client's tool outputs; else raise this error."""
        if run.status is not RunStatus.REQUIRES_ACTION:
            status = run.status.value
            raise cls(run.id, status, f"run {run.id!r} is {status}, not REQUIRES_ACTION")
        return run


class RuntimeClosedError(EngineError):
    """The runtime is shutting down: it accepts no new runs and ends watches it serves from
    the store."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message or "the server is shutting down and accepts no new runs")


class ServerBusyError(EngineError):
    """Every run slot of this process stayed taken for as long as the request could wait
    (engine/admission.py): retry later, or on another replica."""

    def __init__(self, running: int, limit: int, waiting: int) -> None:
        super().__init__(
            f"the server is at its limit of {limit} running runs and none ended in time for "
            "this request: try again later, or on another replica"
        )
        self.running = running
        self.limit = limit
        self.waiting = waiting


class CompactionFailedError(EngineError):
    """CompactSession's summary call failed; `retryable` says whether trying later may work,
    `status_code` and `error_code` are the model error's (the provider's HTTP status and
    code), when it had them."""

    def __init__(
        self,
        message: str,
        *,
        retryable: bool,
        status_code: int | None = None,
        error_code: str | None = None,
    ) -> None:
        super().__init__(f"the summary call failed: {message}")
        self.retryable = retryable
        self.status_code = status_code
        self.error_code = error_code
