"""A2A push notifications: a task's state changes POSTed to the URLs its configs name (the
webhooks of background tasks).

`PushNotifier.watch` follows a run from its journal (on any member, as `SubscribeToTask`
does) while it has configs and POSTs to each config's URL, as the A2A SDK's sender does (a
`StreamResponse` as JSON, `X-A2A-Notification-Token`, `Authorization`):

- when the run starts working: a `statusUpdate` (WORKING);
- when it stops: the whole `task` (COMPLETED with its answer artifacts, FAILED, CANCELED,
  or INPUT_REQUIRED saying what it waits for). A reply to an INPUT_REQUIRED task watches
  its next stretch.

A POST is tried `a2a.push_max_attempts` times (a network error, 408, 429 or 5xx: again after
0.5 s, doubling, at most 30 s; another 4xx: given up), each within `a2a.push_timeout_s`.
Unless `a2a.push_allow_private_hosts`, a URL whose host resolves to a loopback, private,
link-local or other internal address is refused when the config is made and checked again
before every POST (the SDK's `validate_push_notification_url`). A notification that cannot
be delivered is logged (the URL's host, never the token or credentials) and dropped.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlparse

import httpx
from a2a.types import a2a_pb2 as a2a
from a2a.utils.push_url_validator import validate_push_notification_url
from google.protobuf.json_format import MessageToDict

from agio_grpc.config import A2AConfig
from agio_grpc.engine.events import SequencedEvent
from agio_grpc.engine.runtime import Runtime
from agio_grpc.engine.tls import client_tls_context
from agio_grpc.service import convert
from agio_grpc.service.a2a import mapping
from agio_grpc.store.log import SessionLog
from agio_grpc.store.push import PushConfig, PushConfigs
from agio_grpc.v1 import resources_pb2

log = logging.getLogger(__name__)

MAX_URL_CHARS = 2_000
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 30.0
_RETRIED = frozenset({408, 429})
_NOTIFIED = frozenset({"run_started", "run_completed", "run_failed"})


async def run_steps(
    log: SessionLog, run: resources_pb2.Run, tenant: str | None = None
) -> list[resources_pb2.Step]:
    """The steps the run stored (a task's history and artifacts), as `agio.v1` has them."""
    if not run.first_sequence:
        return []
    steps = await log.get_steps(
        run.session_id, run.first_sequence, run.last_sequence or None, tenant=tenant
    )
    return [convert.step_to_proto(step) for step in steps if step.run_id == run.id]


class PushNotifier:
    """Delivers the push notifications of the runs it watches."""

    def __init__(
        self,
        runtime: Runtime,
        configs: PushConfigs,
        settings: A2AConfig,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.configs = configs
        self._runtime = runtime
        self._settings = settings
        self._http = http or httpx.AsyncClient(
            timeout=settings.push_timeout_s, verify=client_tls_context()
        )
        self._watching: dict[str, asyncio.Task[None]] = {}

    async def allowed(self, url: str) -> str:
        """Why `url` may not be a push URL ("" when it may)."""
        parsed = urlparse(url)
        if len(url) > MAX_URL_CHARS:
            return f"must be at most {MAX_URL_CHARS} characters"
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            return "must be an http or https URL"
        if self._settings.push_allow_private_hosts:
            return ""
        if not await validate_push_notification_url(url):
            return (
                "names a host that does not resolve to a public address (a2a."
                "push_allow_private_hosts allows internal ones)"
            )
        return ""

    def watch(self, run_id: str, after_seq: int = 0, *, started: bool = True) -> None:
        """Follow the run from after `after_seq` and notify its configs' URLs (once);
        `started`: notify its start too (not for a run the watch joins late, whose start
        is long past)."""
        if run_id in self._watching:
            return
        task = asyncio.create_task(self._follow(run_id, after_seq, started), name=f"push {run_id}")
        self._watching[run_id] = task
        task.add_done_callback(lambda _: self._watching.pop(run_id, None))

    async def resume(self) -> int:
        """Watch every unfinished run with configs (a server starting: the watches of one
        that stopped are taken up here; a state already notified may be notified again).
        How many."""
        run_ids = await self.configs.unfinished_runs()
        for run_id in run_ids:
            self.watch(run_id, started=False)
        return len(run_ids)

    async def stop(self) -> None:
        for task in list(self._watching.values()):
            task.cancel()
        await asyncio.gather(*self._watching.values(), return_exceptions=True)
        await self._http.aclose()

    async def _follow(self, run_id: str, after_seq: int, started: bool) -> None:
        try:
            async for followed in self._runtime.follow(run_id, after_seq):
                if isinstance(followed, SequencedEvent) and followed.event.type not in _NOTIFIED:
                    continue  # a delta or a step: nothing to notify, nothing to encode
                event = mapping.step_event(followed)
                kind = event.WhichOneof("event")
                if kind == "run_started" and started:
                    run = event.run_started.run
                    update = a2a.TaskStatusUpdateEvent(
                        task_id=run.id, context_id=run.session_id, status=mapping.task_status(run)
                    )
                    await self._notify(run_id, a2a.StreamResponse(status_update=update))
                elif kind in ("run_completed", "run_failed"):
                    run = getattr(event, kind).run
                    task = mapping.task(run, await run_steps(self._runtime.log, run))
                    await self._notify(run_id, a2a.StreamResponse(task=task))
                    return
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("push notifications of task %s stopped", run_id)

    async def _notify(self, run_id: str, payload: a2a.StreamResponse) -> None:
        configs = await self.configs.for_run(run_id)
        body = MessageToDict(payload)
        await asyncio.gather(*(self._deliver(config, body) for config in configs))

    async def _deliver(self, config: PushConfig, body: dict[str, object]) -> None:
        headers: dict[str, str] = {}
        if config.token:
            headers["X-A2A-Notification-Token"] = config.token
        if config.auth_scheme and config.auth_credentials:
            headers["Authorization"] = f"{config.auth_scheme} {config.auth_credentials}"
        host = urlparse(config.url).hostname
        wait = RETRY_FIRST_S
        for attempt in range(1, self._settings.push_max_attempts + 1):
            why = await self.allowed(config.url)
            if why:
                log.warning("push to %s for task %s refused: its URL %s", host, config.run_id, why)
                return
            try:
                response = await self._http.post(config.url, json=body, headers=headers)
            except httpx.HTTPError as error:
                outcome = type(error).__name__
            else:
                if response.is_success:
                    return
                outcome = f"HTTP {response.status_code}"
                if response.status_code < 500 and response.status_code not in _RETRIED:
                    break
            if attempt < self._settings.push_max_attempts:
                await asyncio.sleep(wait)
                wait = min(wait * 2, RETRY_MAX_S)
        log.warning(
            "push to %s for task %s (config %s) not delivered: %s",
            host,
            config.run_id,
            config.id,
            outcome,
        )
