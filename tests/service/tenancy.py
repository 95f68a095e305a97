"""How a test call acquires its tenant: `tenant_metadata(name)`, the one place that says so.

The server's authentication (API keys, JWT) sets the caller of each call with `calling_as`;
until the suite uses real credentials, the test server installs `TenantHeaderInterceptor`
(test-only, never in agio_grpc), which runs each agio.v1 handler as the tenant its call's
`x-test-tenant` metadata names. Switching the suite to API keys is a change of this module
only: `tenant_metadata` returns the key's `authorization` header, `tenant_interceptors` none.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from agio_grpc.handlers import Behavior, rewrap_handler
from agio_grpc.service.identity import Caller, calling_as

TENANT_HEADER = "x-test-tenant"


def tenant_metadata(tenant: str) -> tuple[tuple[str, str], ...]:
    """The metadata that makes a call `tenant`'s."""
    return ((TENANT_HEADER, tenant),)


def _as_tenant(tenant: str, behavior: Behavior) -> Behavior:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        # In the handler's own task, so a streaming handler's writes see the caller too.
        with calling_as(Caller(tenant, subject="test", mode="test")):
            return await behavior(request, context)

    return handler


class TenantHeaderInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Runs each agio.v1 call that names a tenant in `x-test-tenant` as that tenant's (a call
    without it is anonymous: the default tenant)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        metadata = dict(handler_call_details.invocation_metadata or ())
        tenant = metadata.get(TENANT_HEADER)
        if handler is None or not isinstance(tenant, str):
            return handler
        return rewrap_handler(handler, lambda behavior: _as_tenant(tenant, behavior))


def tenant_interceptors() -> list[grpc.aio.ServerInterceptor]:
    """What a test server needs so that `tenant_metadata` makes a call its tenant's."""
    return [TenantHeaderInterceptor()]
