"""Rules of the run lifecycle that the code's shape must keep: runs have one owner.

A run's status is derived in one place (`Run.ended(signal)`, `Run.resumed()`, `Run.queued()`
in domain.py), nothing else in the package assigns one, and only the lifecycle
(engine/lifecycle.py) and the store transactions it calls (the `RunLedger`'s, in
store/sql/runs.py, starts.py and takes.py: a start, a queued start, a continuation, a
take-over of a dead server's run) make those transitions; only the lifecycle imports the
ledger. Checked on
the source, so that a new `run.status = ...` anywhere fails here rather than in production.
"""

from __future__ import annotations

import re
from pathlib import Path

import grimp

import agio_grpc

PACKAGE = Path(agio_grpc.__file__).parent
# `status=RunStatus.X` / `.status = RunStatus.X` / `"status": RunStatus.X` on a run.
ASSIGNMENT = re.compile(
    r"(\.status\s*=(?!=)|\bstatus\s*=\s*RunStatus\.|\"status\"\s*:\s*RunStatus\.)"
)


def test_no_run_status_is_assigned_outside_the_domain_model() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "v1" or path == PACKAGE / "domain.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if ASSIGNMENT.search(line) and "self.status = status" not in line:
                offenders.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert offenders == []


TRANSITION = re.compile(r"\.(ended|resumed|queued)\(")
TRANSITION_OWNERS = {
    "engine/lifecycle.py",
    "store/sql/runs.py",
    "store/sql/starts.py",
    "store/sql/takes.py",
}


def test_only_the_lifecycle_and_its_store_transactions_make_transitions() -> None:
    makers = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = str(path.relative_to(PACKAGE))
        if path.parent.name == "v1" or relative == "domain.py":
            continue
        for line in path.read_text().splitlines():
            if TRANSITION.search(line) and not line.strip().startswith(("#", "`", '"')):
                makers.add(relative)
    assert makers <= TRANSITION_OWNERS
    assert "engine/lifecycle.py" in makers


def test_only_the_lifecycle_imports_the_run_ledger() -> None:
    # The import-linter contract says the same in `make check`; this says it in the suite.
    graph = grimp.build_graph("agio_grpc", cache_dir=None)
    importers = graph.find_modules_that_directly_import("agio_grpc.store.ledger")
    outside_the_store = {name for name in importers if not name.startswith("agio_grpc.store.")}
    assert outside_the_store == {"agio_grpc.engine.lifecycle"}


def test_the_rule_catches_an_assignment() -> None:
    assert ASSIGNMENT.search("        run.status = RunStatus.CANCELLED")
    assert ASSIGNMENT.search("replace(run, status=RunStatus.RUNNING)")
    assert ASSIGNMENT.search('values = {"status": RunStatus.FAILED.value}')
    assert not ASSIGNMENT.search("if run.status == RunStatus.RUNNING:")
    assert not ASSIGNMENT.search("if run.status is RunStatus.RUNNING:")


def test_the_runtime_stays_a_module_of_verbs() -> None:
    lines = (PACKAGE / "engine" / "runtime.py").read_text().count("\n")
    assert lines <= 500, f"engine/runtime.py has {lines} lines: move a concern out"
