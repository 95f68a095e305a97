"""Server reflection that also resolves methods, so that `grpcurl describe Service.Method` and
ghz work without the .proto files.

grpcio-reflection answers `file_containing_symbol` with its descriptor pool's
FindFileContainingSymbol, which (upb and pure-Python protobuf alike) knows messages, enums,
services, extensions and fields but not a service's methods: `agio.v1.AgentService.Run` got
NOT_FOUND (grpc/grpc#34743). The pool handed to it here adds that one lookup and is otherwise
the default pool, which holds every descriptor the generated code registered.

Only `grpc.reflection.v1alpha` is served: grpcio-reflection has no v1 servicer. grpcurl and
`buf curl` ask v1 first and fall back to v1alpha on UNIMPLEMENTED; ghz works with v1alpha.
The HTTP listener serves the same servicer over Connect and gRPC (HTTP/2), for `buf curl`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from google.protobuf import descriptor_pool
from google.protobuf.descriptor import FileDescriptor, ServiceDescriptor
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

REFLECTION_SERVICE: ServiceDescriptor = reflection_pb2.DESCRIPTOR.services_by_name[
    "ServerReflection"
]


class MethodResolvingPool:
    """A descriptor pool whose FindFileContainingSymbol also finds `package.Service.Method`;
    every other lookup is the wrapped pool's."""

    def __init__(self, pool: descriptor_pool.DescriptorPool) -> None:
        self._pool = pool

    def FindFileContainingSymbol(self, symbol: str) -> FileDescriptor:
        try:
            return self._pool.FindFileContainingSymbol(symbol)
        except KeyError:
            pass
        try:
            method = self._pool.FindMethodByName(symbol)
        except KeyError:
            raise KeyError(f"no file contains {symbol}") from None
        return method.containing_service.file

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


def enable_reflection(server: Any, service_names: Iterable[str]) -> None:
    """Serve `grpc.reflection.v1alpha.ServerReflection` on `server` (a grpc.aio server, or
    the HTTP listener's handler table: what the generated `add_*_to_server` take); it lists
    `service_names` and itself, and describes every symbol of the default descriptor pool."""
    servicer = reflection.aio.ReflectionServicer(
        (*service_names, reflection.SERVICE_NAME),
        pool=MethodResolvingPool(descriptor_pool.Default()),
    )
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
