"""The two hypothesis profiles of the adversarial suite, picked by `AGIO_FUZZ_PROFILE`.

`fast` (the default) runs in `make test`: few examples per property, derandomized so the
suite is deterministic. `fuzz` runs in `make fuzz`: 10,000 request cases and 1,000 model
streams per backend, random each time (a failure prints the blob that reproduces it).
Neither keeps an example database: a failure is reported with its minimal example, not
replayed from the checkout. The profiles apply to this package's tests only
(`REQUEST_SETTINGS` and `STREAM_SETTINGS` decorate them); the global default profile is
never changed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from hypothesis import HealthCheck, settings

PROFILE_ENV = "AGIO_FUZZ_PROFILE"

_SHARED_SERVER = [
    # Each backend's server is a module fixture shared by every example on purpose; the
    # suite-wide autouse fixtures are function scoped and check nothing per example.
    HealthCheck.function_scoped_fixture,
]

settings.register_profile(
    "fast",
    max_examples=15,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=_SHARED_SERVER,
)
settings.register_profile(
    "fuzz",
    max_examples=2500,  # per request property: four of them make 10,000 per backend
    deadline=None,
    derandomize=False,
    database=None,
    print_blob=True,
    suppress_health_check=[*_SHARED_SERVER, HealthCheck.too_slow],
)


@dataclass(frozen=True, slots=True)
class Budget:
    """What the active profile allows each property."""

    name: str
    """The profile's name."""
    stream_share: float
    """Model-stream properties run this share of a request property's examples."""
    timeout_s: int
    """The per-test timeout (pytest-timeout): a property's examples all run in one test."""


def active_budget() -> Budget:
    """The profile named by `AGIO_FUZZ_PROFILE` (fast when unset)."""
    name = os.environ.get(PROFILE_ENV, "") or "fast"
    if name == "fast":
        return Budget(name, stream_share=1.0, timeout_s=120)
    if name == "fuzz":
        return Budget(name, stream_share=0.2, timeout_s=7200)
    raise ValueError(f"{PROFILE_ENV} must be fast or fuzz, not {name!r}")


BUDGET = active_budget()
REQUEST_SETTINGS = settings.get_profile(BUDGET.name)
"""Decorates each request property: the active profile, for this package only."""
STREAM_SETTINGS = settings(
    REQUEST_SETTINGS, max_examples=round(REQUEST_SETTINGS.max_examples * BUDGET.stream_share)
)
"""Decorates each model-stream property."""
