"""`Lifecycle`: the one owner of a run's transitions and of the stop signals that end them.

    Run ──begin──> QUEUED ──begin_queued──> RUNNING        (a busy session, with a policy)
    Run ──begin──────────────────────────> RUNNING
    Retry ──restart──────────────────────> RUNNING
    RUNNING ──end──> COMPLETED | FAILED | CANCELLED | INTERRUPTED | REQUIRES_ACTION
    REQUIRES_ACTION ──resume (SubmitToolOutputs; a timed-out approval wait)──> RUNNING
    REQUIRES_ACTION | QUEUED ──end_idle (CancelRun, a superseding run)──> CANCELLED
    RUNNING, its server gone ──interrupt_abandoned | recover_expired | recover_own──> INTERRUPTED

Each transition is one method here and one of the `RunLedger` (store/ledger.py), which only
this class holds: begin → `start_run`, begin_queued → `start_queued_run`, resume →
`continue_run`, restart → `restart_run`, end → `end_run`, end_idle → `end_idle_run`,
interrupt_abandoned → `interrupt_abandoned_run`, recover_expired → `recover_expired_runs`,
recover_own → `recover_own_runs` (each in store/sql/runs.py).

Every transition is ONE store transaction that also journals the events it announces
(engine/journal.py): `begin` takes the session, stores the input, the run and `run_started`
(a reused request_id is refused inside it; a busy session refuses the run, or queues it
with the busy policy's `QueueRequest`); `begin_queued` starts the run heading a free
session's queue; `resume` takes the session, checks the run still waits on the log the
call read, stores the outputs; `restart` takes the session, deletes and creates; `end`
stores the loop's last steps (a reply that stopped the run), the run's end, its session's
release and the terminal event; `end_idle` closes a
waiting run's calls and ends it, or ends a queued one. Whenever a transition frees a
session with a queue, `on_session_free` is told, so that the next queued run starts.

A run's status is never assigned: `Run.ended(signal)` derives it from the signal, and every
signal of a transition that is not the loop's own reason to stop (a cancel, a superseding
run, a shutdown, a lost lease, a call that ended before its run went on) is built here.

One undo path (`_commit`) for a call that stops while its write is in flight: the write
runs to its end in a task of its own; if it committed, the run it started is ended
INTERRUPTED at once (its client is gone, and a RUNNING row with nothing running it would
refuse the session until its lease ran out) and a run it queued is ended; if its outcome is
unclear (the store became unavailable: a COMMIT may have landed) the run is read back and
ended if it is stored RUNNING. A write that failed wrote nothing: every transition takes
the session in its own transaction, so there is no session to give back either.

Never imports grpc, SQLAlchemy or OpenTelemetry; runs change only through its `RunLedger`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, TypeVar

from agio_grpc.domain import (
    Run,
    RunStatus,
    Session,
    Step,
    StopReason,
    StopSignal,
    ToolCall,
    abandoned_run_signal,
    clean_text,
    unanswered_call_result,
    unfinished_reason,
    utc_now,
)
from agio_grpc.engine.channel import RunChannel
from agio_grpc.engine.context import open_tool_calls
from agio_grpc.engine.events import Event, RunStarted, StepCompleted, terminal_event
from agio_grpc.store.errors import (
    LeaseLostError,
    NotFoundError,
    StoreError,
    StoreUnavailableError,
)
from agio_grpc.store.ledger import RunLedger
from agio_grpc.store.log import SessionLog
from agio_grpc.store.records import (
    HistoryMark,
    IdleEnd,
    QueueRequest,
    RunContinuation,
    RunStart,
)

logger = logging.getLogger(__name__)

T = TypeVar("T")

# How long a call whose write failed waits to learn whether it committed.
UNCLEAR_WRITE_CHECK_S = 1.0


# A failed write of a run's end is tried again after each of these pauses (the first: at
# once), for about the time a database failover or a locked SQLite file takes to clear.
END_RETRY_PAUSES_S = (0.0, 0.05, 0.25, 1.0, 3.0)
# The longest stop-signal message `storable` keeps.
STORABLE_MESSAGE_CHARS = 4096


# -- the stop signals of transitions ---------------------------------------------------------


def storable(signal: StopSignal) -> StopSignal:
    """`signal` reduced to what any store takes: its text cleaned and bounded, no context."""
    return replace(signal, message=clean_text(signal.message)[:STORABLE_MESSAGE_CHARS], context={})


def end_unstored(resume_from_sequence: int) -> StopSignal:
    """The stop a stream is told when its run's end could not be stored: what the take-over
    of its session will store once the lease runs out."""
    return abandoned_run_signal(
        "the run's end could not be stored; it ends INTERRUPTED when its session's lease runs out",
        resume_from_sequence,
    )


def cancelled(reason: str, source: str) -> StopSignal:
    """A CancelRun (or a client that went away)."""
    return StopSignal(StopReason.CANCELLED, reason or "cancelled", source or "client")


def server_fault(message: str) -> StopSignal:
    """A fault outside the loop that the run cannot go on past (an event it cannot send)."""
    return StopSignal(StopReason.INTERNAL_ERROR, message, "server")


def deadline_reached() -> StopSignal:
    """The stop of a run its caller's deadline cut off (less the service's margin, so the
    caller still gets the run's end)."""
    return StopSignal(StopReason.TIMEOUT, "the run reached its caller's deadline", "loop")


def shutting_down() -> StopSignal:
    """The server stops while the run goes on: retryable where it stopped."""
    return StopSignal(
        StopReason.INTERRUPTED, "the server is shutting down", "server", retryable=True
    )


def lease_lost() -> StopSignal:
    """The stop of a run that lost its session lease: its server stalled past the lease, and
    the session was taken over or released meanwhile."""
    return StopSignal(
        StopReason.INTERRUPTED,
        "this run lost its session lease (the server stalled past it)",
        "server",
        retryable=True,
    )


def task_cancelled() -> StopSignal:
    """The run's task was cancelled with no stop requested (the event loop tearing down)."""
    return StopSignal(
        StopReason.INTERRUPTED, "the run's task was cancelled", "server", retryable=True
    )


def caller_gone(run: Run) -> StopSignal:
    """The stop of a queued run whose caller's stream died with the server that held it:
    what that caller's deadline, or its end, would have stopped it with."""
    if run.caller_deadline is not None and run.caller_deadline <= utc_now():
        return deadline_reached()
    return cancelled("the caller is gone: the server it called restarted", "server")


def superseded(run_id: str, policy: str) -> StopSignal:
    """The stop of a run a new run interrupted (BUSY_POLICY_INTERRUPT or ROLLBACK)."""
    return StopSignal(
        StopReason.CANCELLED,
        f"superseded by run {run_id} (busy policy {policy})",
        "client",
        context={"superseded_by": run_id},
    )


def call_ended(resume_from_sequence: int) -> StopSignal:
    """The call that started (or continued) the run ended before the run went on."""
    return StopSignal(
        StopReason.INTERRUPTED,
        "the call that started (or continued) this run ended before the run went on",
        "server",
        retryable=True,
        resume_from_sequence=resume_from_sequence,
    )


def internal_error(error: Exception) -> StopSignal:
    """An exception the loop did not expect: logged here, never shown to the client."""
    if isinstance(error, StoreError):
        logger.exception("run stopped by a storage error")
        return StopSignal(
            StopReason.INTERNAL_ERROR,
            f"storage error: {type(error).__name__}: {error}",
            "server",
            retryable=True,
        )
    logger.exception("run stopped by an unexpected error")
    return StopSignal(
        StopReason.INTERNAL_ERROR,
        f"internal error ({type(error).__name__}); see the server log",
        "server",
    )


# -- what transitions announce ---------------------------------------------------------------


def opened(run: Run | None, steps: Sequence[Step]) -> list[Event]:
    """A segment's start: `run_started`, then each of its first steps stored."""
    assert run is not None
    return [RunStarted(run.snapshot()), *(StepCompleted(step) for step in steps)]


def completed(_: Run | None, steps: Sequence[Step]) -> list[Event]:
    """Steps the run stored: each one's `step_completed`."""
    return [StepCompleted(step) for step in steps]


def closed(run: Run | None, steps: Sequence[Step]) -> list[Event]:
    """A segment's end: the steps its end stored, then the terminal event."""
    assert run is not None
    return [*(StepCompleted(step) for step in steps), terminal_event(run.snapshot())]


def _ending(run: Run, signal: StopSignal, channel: RunChannel, steps: Sequence[Step]) -> Run:
    """The run as its end stores it: the terminal event after the steps' `step_completed`s."""
    ended = run.ended(signal)
    ended.last_event_seq = channel.last_seq + len(steps) + 1
    return ended


@dataclass(frozen=True, slots=True)
class SegmentEnd:
    """What `Lifecycle.end` stored."""

    run: Run
    """The run as it ended (another server's end when it took the session over first)."""
    released: bool
    """The run held its session to its end and let it go (see `RunEnd.released`)."""
    journaled: bool
    """Its terminal event is in the journal, ready for `publish`."""
    steps: list[Step] = field(default_factory=list)
    """The steps stored with the end (journaled with it: `publish` sends their
    `step_completed`s before the terminal event)."""

    def publish(self, channel: RunChannel) -> Run:
        """Send the terminal event (the journaled one, under its stored seq); the final run."""
        final = self.run.snapshot()
        if not (self.journaled and channel.publish_journaled()):
            channel.publish(terminal_event(final))
        return final


class Lifecycle:
    """Every change of a run's state, each one store transaction (module docstring)."""

    def __init__(
        self,
        ledger: RunLedger,
        log: SessionLog,
        on_session_free: Callable[[str], None] = lambda _: None,
    ) -> None:
        self._ledger = ledger
        self._log = log
        self.on_session_free = on_session_free
        """Told the id of a session a transition freed that has queued runs."""
        # Undo work of failed or cancelled calls still running (`_clean_up`).
        self._cleanups: set[asyncio.Task[None]] = set()

    # -- transitions ------------------------------------------------------------------------

    async def begin(
        self,
        run: Run,
        steps: list[Step],
        channel: RunChannel,
        *,
        new_session: Session | None,
        since: HistoryMark | None,
        queue: QueueRequest | None = None,
    ) -> RunStart:
        """A new run on its session (or a new one), its input stored; on a busy session,
        refused, or with `queue` stored QUEUED. The store's refusals (busy, waiting,
        duplicate request_id, a full queue, unknown session) write nothing."""
        write = self._ledger.start_run(
            run,
            steps,
            new_session=new_session,
            since=since,
            journal=channel.journal_for(opened),
            queue=queue,
        )
        started = await self._commit(write, run, channel, lambda started: started.run)
        channel.publish_journaled()
        return started

    async def begin_queued(
        self, run: Run, steps: list[Step], channel: RunChannel, since: HistoryMark | None
    ) -> RunStart:
        """The run heading its free session's queue starts, its input stored."""
        write = self._ledger.start_queued_run(
            run, steps, since=since, journal=channel.journal_for(opened)
        )
        started = await self._commit(write, run, channel, lambda started: started.run)
        channel.publish_journaled()
        return started

    async def resume(
        self, run: Run, steps: list[Step], channel: RunChannel, expect: HistoryMark | None
    ) -> RunContinuation:
        """A waiting run going on with its client's tool outputs, if it still waits on the
        log the call read (`expect`)."""
        write = self._ledger.continue_run(
            run, steps, expect=expect, journal=channel.journal_for(opened)
        )
        continued = await self._commit(write, run, channel, lambda continued: continued.run)
        channel.publish_journaled()
        return continued

    async def restart(
        self, run: Run, delete_from: int, channel: RunChannel, expect: HistoryMark | None
    ) -> Run:
        """A Retry's new run, the steps from `delete_from` on deleted, if the session's log
        is still the one the call read (`expect`)."""
        write = self._ledger.restart_run(
            run, delete_from, expect=expect, journal=channel.journal_for(opened)
        )
        # Ended before it went on, it resumes where it was to regenerate from.
        started = await self._commit(
            write, run, channel, lambda started: started, resume_from=delete_from
        )
        channel.publish_journaled()
        return started

    async def end(
        self, run: Run, signal: StopSignal, channel: RunChannel, steps: Sequence[Step] = ()
    ) -> SegmentEnd:
        """The loop's end: its last `steps` (not stored yet: a final answer), the run's final
        state, its session's release and the terminal event, stored together. A write that
        fails is tried again (`END_RETRY_PAUSES_S`): the same one after an unavailable store;
        else without the steps, stopped as a failed write of them stops a run (`lease_lost`,
        `internal_error`), and with the signal reduced to what any store takes (`storable`).
        If every try fails the session stays held: once its lease runs out, the next run on
        it, a restart of this server or any replica's start ends the run INTERRUPTED, as
        the stream is told now; never is a run left RUNNING on a released session."""
        ended = _ending(run, signal, channel, steps)
        for attempt, pause_s in enumerate(END_RETRY_PAUSES_S):
            if pause_s:
                await asyncio.sleep(pause_s)
            try:
                stored = await self._ledger.end_run(
                    ended, steps=steps, journal=channel.journal_for(closed)
                )
            except Exception as error:
                # The error's type only: a driver's message may quote what was written.
                logger.warning(
                    "run %s: storing its end failed (try %d): %s",
                    run.id,
                    attempt + 1,
                    type(error).__name__,
                )
                if isinstance(error, StoreUnavailableError):
                    continue  # nothing was wrong with what was written: the same again
                if steps:  # the run stops as a failed write of its steps would stop it
                    steps = ()
                    lost = isinstance(error, LeaseLostError)
                    signal = lease_lost() if lost else internal_error(error)
                    signal.resume_from_sequence = run.last_sequence + 1
                ended = _ending(run, storable(signal), channel, steps)
                continue
            if stored.queued:
                self.on_session_free(run.session_id)
            if stored.earlier_end is not None:
                # Ended first by the server that took the session over once this run's
                # lease ran out (this one stalled past it): that end is the run's.
                logger.warning("run %s was ended by a take-over of its session", run.id)
                return SegmentEnd(stored.earlier_end, stored.released, journaled=False)
            return SegmentEnd(
                ended.with_steps(stored.steps), stored.released, journaled=True, steps=stored.steps
            )
        logger.error(
            "run %s: its end could not be stored; it ends INTERRUPTED when its session's "
            "lease runs out",
            run.id,
        )
        unstored = run.ended(end_unstored(run.last_sequence + 1))
        unstored.last_event_seq = channel.last_seq + 1
        return SegmentEnd(unstored, released=False, journaled=False)

    async def end_idle(
        self, run: Run, signal: StopSignal, history: list[Step] | None = None
    ) -> IdleEnd | None:
        """End a run nothing runs: one waiting in REQUIRES_ACTION gets an error result for
        each of its open calls first (found in `history`, the session's whole log, read when
        not given; the write checks it is still the log); a QUEUED one never starts. Returns
        the run and the steps as stored; None when it is no longer idle (continued, started
        or ended meanwhile)."""
        pending: list[ToolCall] = []
        if run.status is RunStatus.REQUIRES_ACTION:
            if history is None:
                history = await self._log.get_history(run.session_id, run.first_sequence or 1)
            pending = open_tool_calls(history)[1]
        expect = HistoryMark(history[-1].sequence, history[-1].id) if history else None
        why = unfinished_reason(signal)
        results = [unanswered_call_result(run.session_id, run.id, call, why) for call in pending]
        ended = run.ended(signal)
        ended.last_event_seq = run.last_event_seq + len(results) + 1
        channel = RunChannel(run.id, run.session_id, start_after_seq=run.last_event_seq)
        stored = await self._ledger.end_idle_run(
            ended, results, expect=expect, journal=channel.journal_for(closed)
        )
        if stored is not None and stored.queued:
            self.on_session_free(run.session_id)  # it may have held up the queue
        return stored

    async def interrupt_abandoned(self, run_id: str) -> bool:
        """End the run INTERRUPTED if its server is gone (RunLedger.interrupt_abandoned_run):
        for a watcher that found its live stream gone. Whether it did."""
        return await self._ledger.interrupt_abandoned_run(run_id)

    async def recover_own(self) -> list[str]:
        """At start, before serving: end the runs this server's instance left RUNNING when
        it stopped, and release their sessions; and end the queued runs whose callers'
        streams it held, which died with it, as those callers' ends would have: TIMEOUT past
        the caller's deadline, else CANCELLED (their disconnect policy: a run whose caller
        asked it to go on has no caller stored). The run ids ended."""
        ended = await self._ledger.recover_own_runs()
        for run in await self._ledger.queued_runs_called_here():
            if await self.end_idle(run, caller_gone(run)) is not None:
                ended.append(run.id)
        return ended

    async def runs_past_approval_deadline(self, now: datetime) -> list[Run]:
        """Waiting runs whose calls held for approval are past their deadline at `now`: the
        server answers them (engine/approval_timeouts.py) through `resume`."""
        return await self._ledger.runs_past_approval_deadline(now)

    async def next_approval_deadline(self) -> datetime | None:
        """The earliest deadline of a wait for approval, if any run has one."""
        return await self._ledger.next_approval_deadline()

    async def recover_expired(self) -> list[str]:
        """End the runs whose servers stopped renewing their leases, and release their
        sessions (safe beside live replicas); the run ids ended."""
        return await self._ledger.recover_expired_runs()

    # -- the undo path ----------------------------------------------------------------------

    async def _commit(
        self,
        write: Coroutine[Any, Any, T],
        run: Run,
        channel: RunChannel,
        stored_run: Callable[[T], Run],
        *,
        resume_from: int = 0,
    ) -> T:
        """Await a transition's write; if the call stops meanwhile (cancelled, or the write
        failed), undo what the write may have done once it ended (module docstring)."""
        writing = asyncio.ensure_future(write)
        try:
            return await asyncio.shield(writing)
        except BaseException:
            undo = self._undo(writing, run, channel, stored_run, resume_from)
            await self._clean_up(undo)
            raise

    async def _undo(
        self,
        writing: asyncio.Future[T],
        run: Run,
        channel: RunChannel,
        stored_run: Callable[[T], Run],
        resume_from: int,
    ) -> None:
        stored: Run | None = None
        try:
            stored = stored_run(await writing)  # a transaction runs to its end
        except StoreUnavailableError:
            stored = await self._stored_running(run.id)  # it may have committed all the same
        except BaseException:
            return  # refused or failed: nothing written, the session not taken either
        if stored is None:
            return
        if stored.status is RunStatus.RUNNING:
            channel.publish_journaled()  # what it stored, before its end (no one listens)
            await self.end_unstarted(stored, channel, resume_from)
        elif stored.status is RunStatus.QUEUED:  # queued for a caller that is gone
            await self.end_idle(stored, call_ended(0))

    async def abandon(self, run: Run, channel: RunChannel) -> None:
        """End a run whose call failed after its start was stored (`end_unstarted`), even if
        the call is cancelled meanwhile."""
        await self._clean_up(self.end_unstarted(run, channel))

    async def end_unstarted(self, run: Run, channel: RunChannel, resume_from: int = 0) -> None:
        """End a run stored RUNNING whose call ended before its loop started: INTERRUPTED,
        retryable from `resume_from` (0: after its last step), its session released. Never
        raises."""
        ended = run.ended(call_ended(resume_from or run.last_sequence + 1))
        ended.last_event_seq = channel.last_seq + 1
        try:
            stored = await self._ledger.end_run(ended, journal=channel.journal_for(closed))
            channel.publish_journaled()  # to a caller following the run, if one does
            if stored.queued:
                self.on_session_free(run.session_id)
        except NotFoundError:  # the run was never stored
            await self.release(run.session_id, run.id)
        except Exception:
            logger.exception("could not end run %s, which never started", run.id)
            await self.release(run.session_id, run.id)

    async def _stored_running(self, run_id: str) -> Run | None:
        """The run as stored, if it is RUNNING: what a write whose outcome was unclear left.
        None as well when the store cannot say within `UNCLEAR_WRITE_CHECK_S`: the caller's
        error waits for this, and a store that just failed may take its connect timeout to
        fail again."""
        try:
            async with asyncio.timeout(UNCLEAR_WRITE_CHECK_S):
                run = await self._ledger.get_run(run_id)
        except Exception:  # TimeoutError included
            return None
        return run if run.status is RunStatus.RUNNING else None

    async def release(self, session_id: str, run_id: str) -> None:
        """Let go of the session if the run still holds it. Never raises."""
        try:
            await self._ledger.release_session(session_id, run_id)
        except Exception:
            logger.exception("could not release session %s held by run %s", session_id, run_id)

    async def _clean_up(self, work: Awaitable[None]) -> None:
        """Run `work` in a task of its own: it runs to its end even when the call is
        cancelled (again) while waiting for it; `settle` waits for what is still running."""
        task = asyncio.ensure_future(work)
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)
        await asyncio.shield(task)  # a cancel goes on to the caller; the task runs on

    async def settle(self, wait_s: float) -> None:
        """Wait (up to `wait_s`) for the undo work of failed or cancelled calls. For a server
        stopping: after its calls are cancelled, before the store closes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while self._cleanups and (left := deadline - loop.time()) > 0:
            await asyncio.wait(set(self._cleanups), timeout=left)
