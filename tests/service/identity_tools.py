"""A server tool that reports who its run runs for: the end-to-end tests check that the
authenticated caller reaches the run's tools (`use the whoami tool`)."""

from __future__ import annotations

from agio_grpc.service.identity import current_caller


def whoami() -> str:
    """The tenant, subject and authentication mode of the caller the run serves."""
    caller = current_caller()
    return f"{caller.tenant}|{caller.subject}|{caller.mode}"


TOOLS = [whoami]
