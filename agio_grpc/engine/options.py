"""`RuntimeOptions`: the runtime's tuning knobs (the service fills them from its settings)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RuntimeOptions:
    """The runtime's tuning knobs."""

    cancel_wait_s: float = 10.0
    """How long `cancel`, `shutdown` and `settle` wait for runs and clean-ups to finish."""
    cancel_poll_s: float = 0.5
    """How often this process looks for cancel requests other replicas recorded for its live
    runs (with leases)."""
    watch_poll_s: float = 0.25
    """How often a watch of a run another process runs reads the journal."""
    history_cache_bytes: int = 64_000_000
    """Memory bound of the histories kept between runs (engine/history.py); 0 keeps none."""
    max_queued_runs: int = 10
    """How many runs one session's queue may hold (BUSY_POLICY_ENQUEUE and the rest)."""
    max_running_runs: int | None = None
    """How many run segments run here at once (None: no limit); more wait for a slot, for at
    most the shorter of half the time to their caller's deadline and `admission_wait_s`
    (engine/admission.py)."""
    admission_wait_s: float = 30.0
    """The longest a run waits for a slot before ServerBusyError, with a deadline or
    without."""
    """How long a run without a deadline waits for a slot before ServerBusyError."""
    approval_poll_s: float = 1.0
    """How often this process looks for runs whose calls waiting for approval are past their
    `approval_timeout_s` (it also wakes at the earliest such deadline it knows of)."""
