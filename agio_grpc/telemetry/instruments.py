"""The metric instruments agio-grpc records, created once per meter provider."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from opentelemetry.metrics import (
    CallbackOptions,
    Counter,
    Histogram,
    MeterProvider,
    ObservableGauge,
    Observation,
    UpDownCounter,
)
from opentelemetry.semconv._incubating.metrics import gen_ai_metrics

from agio_grpc.telemetry import attributes as agio

INSTRUMENTATION_NAME = "agio_grpc"

# Seconds buckets from 5 ms to ~80 s, for model and tool calls (the SDK default tops at 10 s
# in ms-sized steps that suit nothing here).
DURATION_BUCKETS = (
    0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
# Seconds buckets for waits on a person: a second to a week.
APPROVAL_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 24 * 3600, 7 * 24 * 3600)
TOKEN_BUCKETS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216,
)  # fmt: skip


@dataclass(slots=True)
class Observed:
    """A value an observable instrument reads at each collection, from a source given once
    the thing it measures exists (nothing is reported before)."""

    read: Callable[[], int] | None = None

    def observe(self, read: Callable[[], int]) -> None:
        self.read = read

    def observations(self, options: CallbackOptions) -> Iterable[Observation]:
        return [] if self.read is None else [Observation(self.read())]


@dataclass(frozen=True, slots=True)
class Instruments:
    token_usage: Histogram
    operation_duration: Histogram
    time_to_first_chunk: Histogram
    tool_duration: Histogram
    runs_ended: Counter
    runs_active: UpDownCounter
    steps_written: Counter
    context_build_duration: Histogram
    store_duration: Histogram
    retries: Counter
    model_retries: Counter
    forks: Counter
    compactions: Counter
    compaction_tokens: Histogram
    history_cache_usage: ObservableGauge
    output_invalid: Counter
    approval_wait: Histogram
    history_cache_bytes: Observed = field(default_factory=Observed)
    """Where `history_cache_usage` reads the cache's size: the runtime's, once it exists
    (`history_cache_bytes.observe(runtime.history_cache_bytes)`)."""

    @classmethod
    def create(cls, provider: MeterProvider) -> Instruments:
        meter = provider.get_meter(INSTRUMENTATION_NAME)
        cache_bytes = Observed()
        return cls(
            history_cache_bytes=cache_bytes,
            history_cache_usage=meter.create_observable_gauge(
                agio.METRIC_HISTORY_CACHE_USAGE,
                callbacks=[cache_bytes.observations],
                unit="By",
                description="Estimated memory of the session histories kept between runs",
            ),
            token_usage=meter.create_histogram(
                gen_ai_metrics.GEN_AI_CLIENT_TOKEN_USAGE,
                unit="{token}",
                description="Number of input and output tokens used",
                explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
            ),
            operation_duration=meter.create_histogram(
                gen_ai_metrics.GEN_AI_CLIENT_OPERATION_DURATION,
                unit="s",
                description="GenAI operation duration",
                explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
            ),
            time_to_first_chunk=meter.create_histogram(
                gen_ai_metrics.GEN_AI_CLIENT_OPERATION_TIME_TO_FIRST_CHUNK,
                unit="s",
                description="Time to receive the first chunk of a streamed model reply",
                explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
            ),
            tool_duration=meter.create_histogram(
                agio.METRIC_TOOL_DURATION,
                unit="s",
                description="Duration of server tool calls",
                explicit_bucket_boundaries_advisory=DURATION_BUCKETS,
            ),
            runs_ended=meter.create_counter(
                agio.METRIC_RUNS_ENDED,
                unit="{run}",
                description="Run segments ended, by stop reason",
            ),
            runs_active=meter.create_up_down_counter(
                agio.METRIC_RUNS_ACTIVE, unit="{run}", description="Run segments running now"
            ),
            steps_written=meter.create_counter(
                agio.METRIC_STEPS_WRITTEN, unit="{step}", description="Steps stored, by role"
            ),
            context_build_duration=meter.create_histogram(
                agio.METRIC_CONTEXT_BUILD_DURATION,
                unit="s",
                description="Time to build the messages of a model call from the step log",
            ),
            store_duration=meter.create_histogram(
                agio.METRIC_STORE_DURATION,
                unit="s",
                description="Step-store operation latency, by operation",
            ),
            retries=meter.create_counter(
                agio.METRIC_RETRIES, unit="{run}", description="Retry runs started"
            ),
            model_retries=meter.create_counter(
                agio.METRIC_MODEL_RETRIES, unit="{retry}", description="Model call retries"
            ),
            forks=meter.create_counter(
                agio.METRIC_FORKS, unit="{session}", description="Sessions forked"
            ),
            compactions=meter.create_counter(
                agio.METRIC_COMPACTIONS,
                unit="{compaction}",
                description="Context compactions stored, by trigger",
            ),
            compaction_tokens=meter.create_histogram(
                agio.METRIC_COMPACTION_TOKENS,
                unit="{token}",
                description="Estimated prompt tokens before and after a compaction",
                explicit_bucket_boundaries_advisory=TOKEN_BUCKETS,
            ),
            output_invalid=meter.create_counter(
                agio.METRIC_OUTPUT_INVALID,
                unit="{answer}",
                description="Final answers that failed their run's output schema",
            ),
            approval_wait=meter.create_histogram(
                agio.METRIC_APPROVAL_WAIT,
                unit="s",
                description="Time tool calls waited for approval, by outcome",
                explicit_bucket_boundaries_advisory=APPROVAL_BUCKETS,
            ),
        )
