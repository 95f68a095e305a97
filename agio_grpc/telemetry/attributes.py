"""The attribute and metric names agio-grpc adds to the OpenTelemetry conventions, in one place.

GenAI, RPC and error attribute names come from the semantic-conventions package; these are
the application's own (`agio.*`).
"""

from __future__ import annotations

from typing import Final

RUN_ID: Final = "agio.run.id"
SESSION_ID: Final = "agio.session.id"
TENANT: Final = "agio.tenant"
"""On a run segment's span: the tenant the run belongs to (its session's)."""
STEP_ID: Final = "agio.step.id"
STEP_SEQUENCE: Final = "agio.step.sequence"
"""On a model or tool call span: the sequence its step is stored at."""
STEP_ROLE: Final = "agio.step.role"
RUN_OPERATION: Final = "agio.run.operation"
"""What started the run segment: `run`, `submit_tool_outputs` or `retry`."""
RUN_STATUS: Final = "agio.run.status"
STOP_REASON: Final = "agio.stop.reason"
STOP_SOURCE: Final = "agio.stop.source"
STOP_RETRYABLE: Final = "agio.stop.retryable"
RUN_STEP_COUNT: Final = "agio.run.step_count"
CANCELLED: Final = "agio.cancelled"
"""A call cut off by the run's cancellation, interruption or timeout (not an error)."""
MODEL_RETRIES: Final = "agio.model.retries"
MODEL_ERROR_CODE: Final = "agio.model.error_code"
"""On a failed model call's span: the provider's error code (`invalid_api_key`), when it sent
one (`error.type` is the HTTP status when there was one)."""
TOOL_STOP: Final = "agio.tool.stop"
CONTEXT_MESSAGES: Final = "agio.context.messages"
HISTORY_KEPT_STEPS: Final = "agio.history.kept_steps"
"""On a run segment's span: steps of its history taken from what the server kept of the
session since its previous run (0: the whole history came from the store)."""
HISTORY_READ_STEPS: Final = "agio.history.read_steps"
"""On a run segment's span: steps of its history read from the store."""
STORE_OPERATION: Final = "agio.store.operation"
COMPACTION_TRIGGER: Final = "agio.compaction.trigger"
"""What set a compaction off: `threshold`, `overflow` or `request`."""
COMPACTION_TOKENS_BEFORE: Final = "agio.compaction.tokens_before"
COMPACTION_TOKENS_AFTER: Final = "agio.compaction.tokens_after"
COMPACTION_STAGE: Final = "agio.compaction.stage"
"""On `agio.context.compaction.tokens`: `before` or `after` the compaction."""
MCP_SERVER: Final = "agio.mcp.server"
"""On an MCP tool call's span: the configured name of its server."""
MCP_TOOL: Final = "agio.mcp.tool"
"""On an MCP tool call's span: the tool's name on its server (the model calls it
`server__tool`, `gen_ai.tool.name`)."""

APPROVAL_EVENT: Final = "agio.approval"
"""A span event per decision on a call that waited for approval: on the tool's span for an
approved call, on the span of the segment that stored the rejection for a rejected one."""
APPROVAL_APPROVED: Final = "agio.approval.approved"
APPROVAL_WAIT_S: Final = "agio.approval.wait_s"
"""Seconds from the run's wait to the decision."""
APPROVAL_DECIDED_BY: Final = "agio.approval.decided_by"
"""The deciding credential's id (`server` for a timeout)."""
APPROVAL_OUTCOME: Final = "agio.approval.outcome"
"""On `agio.approval.wait.duration`: `approved`, `rejected` or `timed_out`."""

# Metrics of our own (the GenAI ones come from the semconv package).
METRIC_TOOL_DURATION: Final = "agio.tool.duration"
METRIC_RUNS_ENDED: Final = "agio.runs.ended"
METRIC_RUNS_ACTIVE: Final = "agio.runs.active"
METRIC_STEPS_WRITTEN: Final = "agio.steps.written"
METRIC_CONTEXT_BUILD_DURATION: Final = "agio.context.build.duration"
METRIC_STORE_DURATION: Final = "agio.store.operation.duration"
METRIC_RETRIES: Final = "agio.runs.retries"
"""Retry RPCs (regenerations) started."""
METRIC_MODEL_RETRIES: Final = "agio.model.retries"
"""Model call attempts retried (429, 5xx, broken streams)."""
METRIC_FORKS: Final = "agio.sessions.forks"
METRIC_COMPACTIONS: Final = "agio.context.compactions"
"""Compactions stored, by trigger."""
METRIC_COMPACTION_TOKENS: Final = "agio.context.compaction.tokens"
"""Estimated prompt tokens before and after each compaction."""
METRIC_HISTORY_CACHE_USAGE: Final = "agio.history.cache.usage"
"""Estimated bytes of the histories kept between runs (`server.history_cache_mb` bounds it)."""
METRIC_OUTPUT_INVALID: Final = "agio.output.validation_failures"
"""Final answers that failed their run's output schema, by agent."""
OUTPUT_ERRORS: Final = "agio.output.errors"
"""On an `output_invalid` span event: the failed checks (`$.city: type`, `not JSON`), or
with content capture on, the validation errors' messages (which quote the answer)."""
OUTPUT_REPAIRS: Final = "agio.output.repairs"
"""On an `output_invalid` span event: the repair calls asked for before this answer."""
METRIC_APPROVAL_WAIT: Final = "agio.approval.wait.duration"
"""How long each call waited for its decision, by outcome (its count: the decisions)."""
