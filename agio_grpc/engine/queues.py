"""`RunQueues`: runs queued behind their session's busy run, and their start.

A run a busy session queued (BUSY_POLICY_ENQUEUE, INTERRUPT, ROLLBACK) waits in the store,
its input on its row. Whichever transition frees the session (a run's end, a waiting or
queued run's cancel) has the lifecycle call `LiveRuns.session_freed` (engine/live.py),
which the queues answer with `start_next_soon`; the lease keeper's sweep of `ready_queues`
(every third of a lease) does the same for the queues a crash left with no one to start
them. Starting is one store transaction (`Lifecycle.begin_queued`), which only the head of
a free session's queue passes, on whichever member; the run then starts as any new run
does (`Segments.spawn_started`).

The caller of a queued run follows the channel its queueing published to: when this
process starts the run, it goes on in that same channel, so the caller misses nothing,
deltas included; when another member starts (or a cancel ends) it, the caller follows it
as any watcher does (`Watching.follow`: live from that member, then from the journal). A
caller's deadline holds while the run is queued: the run is stopped TIMEOUT when it comes
(ending a queued run, stopping a started one wherever it runs: engine/stopping.py), and a
run started here gets it as any run does. Never imports grpc.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import AsyncIterator
from contextvars import Context
from datetime import timedelta

from agio_grpc.domain import BusyPolicy, Role, Run, RunStatus, Session, Step, utc_now
from agio_grpc.engine.agents import AgentCatalog, RunInput, RunSettings
from agio_grpc.engine.channel import RunChannel
from agio_grpc.engine.history import HistoryCache
from agio_grpc.engine.lifecycle import Lifecycle, deadline_reached, superseded
from agio_grpc.engine.live import LiveRuns
from agio_grpc.engine.options import RuntimeOptions
from agio_grpc.engine.remote import FollowedEvent
from agio_grpc.engine.segments import RunHandle, Segments
from agio_grpc.engine.stopping import RunStops
from agio_grpc.engine.tracing import RunTrace, RunTracer
from agio_grpc.engine.watching import Watching
from agio_grpc.store.errors import (
    RunRequiresActionError,
    RunStateConflictError,
    SessionBusyError,
)
from agio_grpc.store.records import HistoryMark, QueueRequest, RunStart
from agio_grpc.store.runs import RunRecords

logger = logging.getLogger(__name__)

# How often a run interrupting a run that waits for its client ends that run and tries again
# (another client may put a new waiting run in its way meanwhile).
_INTERRUPT_ATTEMPTS = 3


class RunQueues:
    """Queued runs: their handles, and their start when their session frees."""

    def __init__(
        self,
        runs: RunRecords,
        lifecycle: Lifecycle,
        live: LiveRuns,
        segments: Segments,
        *,
        histories: HistoryCache,
        tracer: RunTracer,
        catalog: AgentCatalog,
        stops: RunStops,
        watching: Watching,
        options: RuntimeOptions,
    ) -> None:
        """Answers `live`'s sessions that free; `stops` stops a run at its caller's
        deadline, wherever it is; `watching` follows one started elsewhere."""
        self._runs = runs
        self._lifecycle = lifecycle
        self._live = live
        self._segments = segments
        self._histories = histories
        self._tracer = tracer
        self._catalog = catalog
        self._stops = stops
        self._watching = watching
        self._poll_s = options.watch_poll_s
        self._max_queued = options.max_queued_runs
        live.when_session_frees(self.start_next_soon)
        # Starts of queued runs still running (`start_next_soon`): their tasks, the sessions
        # they start, and the sessions asked for again meanwhile.
        self._starting: set[asyncio.Task[None]] = set()
        self._sessions: set[str] = set()
        self._again: set[str] = set()
        # The channels of runs queued here, while their handles live (`handle`).
        self._channels: weakref.WeakValueDictionary[str, RunChannel] = weakref.WeakValueDictionary()
        # The deadlines (event loop time) of the callers following runs queued here.
        self._deadlines: dict[str, float] = {}
        self._stopping: set[asyncio.Task[Run]] = set()  # their stops, once it came

    async def begin(
        self,
        run: Run,
        user: Step,
        channel: RunChannel,
        new_session: Session | None,
        since: HistoryMark | None,
        request: RunInput,
    ) -> RunStart:
        """`Lifecycle.begin` with the busy policy's `QueueRequest`. INTERRUPT and ROLLBACK
        end a run waiting for its client first (the store leaves that to the engine: its
        open calls need error results), then try again."""
        policy = request.on_busy
        queue = self._queue_request(run.id, request)
        for _ in range(_INTERRUPT_ATTEMPTS):
            try:
                return await self._lifecycle.begin(
                    run, [user], channel, new_session=new_session, since=since, queue=queue
                )
            except RunRequiresActionError as waiting:
                if queue is None or not queue.ahead:
                    raise
                blocking = await self._runs.get_run(waiting.active_run_id)
                await self._lifecycle.end_idle(blocking, superseded(run.id, policy.value))
                if queue.rollback:
                    run.supersedes = blocking.id
                    run.rollback_from = blocking.first_sequence
        return await self._lifecycle.begin(
            run, [user], channel, new_session=new_session, since=since, queue=queue
        )

    def _queue_request(self, run_id: str, request: RunInput) -> QueueRequest | None:
        policy = request.on_busy
        if policy is BusyPolicy.REJECT:
            return None
        ahead = policy in (BusyPolicy.INTERRUPT, BusyPolicy.ROLLBACK)
        deadline = None
        if request.deadline_at is not None:  # as the wall clock, which other servers share
            left_s = request.deadline_at - asyncio.get_running_loop().time()
            deadline = utc_now() + timedelta(seconds=left_s)
        return QueueRequest(
            self._max_queued,
            ahead=ahead,
            supersede=superseded(run_id, policy.value) if ahead else None,
            rollback=policy is BusyPolicy.ROLLBACK,
            followed=request.followed,
            deadline=deadline,
        )

    def handle(
        self,
        started: RunStart,
        policy: BusyPolicy,
        channel: RunChannel,
        deadline_at: float | None,
    ) -> RunHandle:
        """The handle of a run stored QUEUED, whose caller's deadline is `deadline_at`. The
        run it interrupts is stopped now if it runs here (one elsewhere finds the store's
        cancel request); a free session starts its queue."""
        run_id = started.run.id
        if started.interrupted:
            control = self._live.control(started.interrupted)
            if control is not None:
                control.request_stop(superseded(run_id, policy.value))
        self._channels[run_id] = channel
        if deadline_at is not None:
            self._deadlines[run_id] = deadline_at
        if not started.holder:
            self.start_next_soon(started.run.session_id)
        return RunHandle(
            started.run.snapshot(),
            lambda after: self._follow(run_id, channel, after, deadline_at),
        )

    async def _follow(
        self,
        run_id: str,
        channel: RunChannel,
        after_seq: int,
        deadline_at: float | None,
    ) -> AsyncIterator[FollowedEvent]:
        """A queued run's events: from its channel while it waits or runs here (the channel
        then has every one of them, to the terminal event); as any watcher follows it once
        it started (or ended) without this process. At `deadline_at` the run is stopped
        TIMEOUT, wherever it is."""
        loop = asyncio.get_running_loop()
        queued_seq = channel.last_seq
        cursor = after_seq
        try:
            while True:
                events = channel.events_after(cursor)
                for event in events:
                    yield event
                    cursor = event.seq
                    if event.is_terminal:
                        return
                if deadline_at is not None and loop.time() >= deadline_at:
                    deadline_at = None
                    await self._stops.stop(run_id, deadline_reached())
                    continue
                here = channel.last_seq > queued_seq or self._live.starts_here(run_id)
                if not events and not here:
                    run = await self._runs.get_run(run_id)
                    here = channel.last_seq > queued_seq or self._live.starts_here(run_id)
                    if run.status is not RunStatus.QUEUED and not here:
                        async for followed in self._follow_until(run_id, cursor, deadline_at):
                            yield followed
                        return
                wait_s = self._poll_s
                if deadline_at is not None:
                    wait_s = min(wait_s, max(0.0, deadline_at - loop.time()))
                await channel.wait_beyond(cursor, wait_s)
        finally:
            self._deadlines.pop(run_id, None)

    async def _follow_until(
        self, run_id: str, after_seq: int, deadline_at: float | None
    ) -> AsyncIterator[FollowedEvent]:
        """`Watching.follow` of a run started elsewhere, stopped TIMEOUT at `deadline_at`
        (which that process, not having the caller, does not know)."""
        timer: asyncio.TimerHandle | None = None
        if deadline_at is not None:

            def stop() -> None:
                task = asyncio.ensure_future(self._stops.stop(run_id, deadline_reached()))
                self._stopping.add(task)
                task.add_done_callback(self._stopping.discard)

            timer = asyncio.get_running_loop().call_at(deadline_at, stop)
        try:
            async for event in self._watching.follow(run_id, after_seq):
                yield event
        finally:
            if timer is not None:
                timer.cancel()

    def start_next_soon(self, session_id: str) -> None:
        """Start the run heading the session's queue, in a task of its own (with a context
        of its own: its trace must not continue the trace of whatever freed the session).
        One start per session at a time: asked again while one is under way, it looks at
        the queue once more when that one is done."""
        if self._live.closing:
            return
        if session_id in self._sessions:
            self._again.add(session_id)
            return
        self._sessions.add(session_id)
        task = asyncio.get_running_loop().create_task(
            self._start_queue(session_id), name=f"agio queue {session_id}", context=Context()
        )
        self._starting.add(task)
        task.add_done_callback(self._starting.discard)

    async def _start_queue(self, session_id: str) -> None:
        try:
            while True:
                self._again.discard(session_id)
                await self._start_next(session_id)
                if session_id not in self._again or self._live.closing:
                    return
        finally:
            self._sessions.discard(session_id)

    async def settle(self, wait_s: float) -> None:
        """Wait (up to `wait_s`) for the starts under way (the runtime is closing: no other
        one begins)."""
        if self._starting:
            await asyncio.wait(set(self._starting), timeout=wait_s)

    async def _start_next(self, session_id: str) -> None:
        """Start the run heading the session's queue, if the session lets it. Never raises:
        what cannot start now is started by whichever transition frees the session next, or
        by the sweep of ready queues."""
        run: Run | None = None
        try:
            run = await self._runs.next_queued_run(session_id)
            if run is None or self._live.closing:
                return
            if run.caller_deadline is not None and run.caller_deadline <= utc_now():
                # Its caller's deadline passed while it waited, wherever that caller was (a
                # caller here has its timer too): it ends TIMEOUT instead of starting, and
                # the next in the queue is looked at once that end frees the session.
                await self._lifecycle.end_idle(run, deadline_reached())
                return
            settings = self._catalog.settings_of(run)
            trace = self._tracer.start_run(run, settings, "run")
            run.trace_id = trace.trace_id
            user = Step(
                session_id,
                run.id,
                Role.USER,
                content=run.input,
                trace_id=trace.trace_id,
                span_id=trace.span_id,
            )
            # Not taken out until the run started: a start that loses the race leaves it.
            channel = self._channels.get(run.id)
            if channel is None or channel.last_seq != run.last_event_seq:
                channel = RunChannel(run.id, session_id, start_after_seq=run.last_event_seq)
            self._live.starting.add(run.id)
            try:
                await self._start(run, settings, user, channel, trace)
            finally:
                self._live.starting.discard(run.id)
        except RunRequiresActionError as waiting:
            # The run it was to interrupt stopped to wait for its client before it saw the
            # request (its end clears it): end that one now, as the interrupt asked.
            if run is not None and run.supersedes == waiting.active_run_id:
                await self._supersede_waiting(run, waiting.active_run_id)
        except (SessionBusyError, RunStateConflictError):
            return  # another member started it, or something else holds the session
        except Exception:
            logger.exception("could not start the next queued run of session %s", session_id)

    async def _supersede_waiting(self, run: Run, waiting_id: str) -> None:
        """End the run `run` was queued to interrupt, which waits for its client now; then
        look at the queue again."""
        policy = BusyPolicy.ROLLBACK if run.rollback_from else BusyPolicy.INTERRUPT
        try:
            waiting = await self._runs.get_run(waiting_id)
            await self._lifecycle.end_idle(waiting, superseded(run.id, policy.value))
        except Exception:
            logger.exception("could not end run %s, which run %s interrupts", waiting_id, run.id)
            return
        self._again.add(run.session_id)

    async def _start(
        self, run: Run, settings: RunSettings, user: Step, channel: RunChannel, trace: RunTrace
    ) -> None:
        cached = self._histories.cached(run.session_id)
        try:
            started = await self._lifecycle.begin_queued(run, [user], channel, cached.mark)
        except BaseException:
            trace.end(run)
            raise
        self._channels.pop(run.id, None)
        deadline_at = self._deadlines.pop(run.id, None)
        await self._segments.spawn_started(started, cached, settings, channel, trace, deadline_at)
