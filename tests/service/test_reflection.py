"""Server reflection describes every served symbol, methods included, so that grpcurl and ghz
need no .proto files; `scripts/protoset.py` writes the same contract for `-protoset`.

The grpcurl case runs the real binary: it skips when grpcurl is not on PATH, or fails then
when AGIO_REQUIRE_GRPCURL is set (CI sets it and installs grpcurl).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from agio_grpc.service.app import AgioApp
from agio_grpc.service.server import A2A_SERVICE_NAME, SERVICE_NAMES
from agio_grpc.v1 import agent_service_pb2, session_service_pb2

ROOT = Path(__file__).resolve().parents[2]
ENV_REQUIRE_GRPCURL = "AGIO_REQUIRE_GRPCURL"


@pytest.fixture
async def reflection(app: AgioApp) -> AsyncIterator[Any]:
    """A v1alpha ServerReflection stub on the running service."""
    async with grpc.aio.insecure_channel(app.address) as channel:
        yield reflection_pb2_grpc.ServerReflectionStub(channel)


async def ask(stub: Any, request: Any) -> Any:
    """One request on the reflection stream; its one response."""
    async for response in stub.ServerReflectionInfo(iter([request]), timeout=10):
        return response
    raise AssertionError("the reflection stream ended without a response")


def files_of(response: Any) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """The files of a file_descriptor_response, by name."""
    assert response.WhichOneof("message_response") == "file_descriptor_response", response
    parsed = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in response.file_descriptor_response.file_descriptor_proto
    ]
    return {file.name: file for file in parsed}


def defined_names(file: descriptor_pb2.FileDescriptorProto) -> set[str]:
    """Full names of the file's services, their methods and its top-level messages."""
    names = {f"{file.package}.{message.name}" for message in file.message_type}
    for service in file.service:
        service_name = f"{file.package}.{service.name}"
        names |= {service_name, *(f"{service_name}.{method.name}" for method in service.method)}
    return names


@pytest.mark.parametrize(
    ("symbol", "file_name"),
    [
        ("agio.v1.AgentService.Run", "agio/v1/agent_service.proto"),
        ("agio.v1.AgentService.ListAgents", "agio/v1/agent_service.proto"),
        ("agio.v1.SessionService.ForkSession", "agio/v1/session_service.proto"),
        ("grpc.health.v1.Health.Check", "grpc_health/v1/health.proto"),
        ("agio.v1.AgentService", "agio/v1/agent_service.proto"),
        ("agio.v1.RunRequest", "agio/v1/agent_service.proto"),
        ("agio.v1.StepEvent", "agio/v1/events.proto"),
    ],
)
async def test_a_method_service_or_message_resolves_to_its_file_with_imports(
    reflection: Any, symbol: str, file_name: str
) -> None:
    request = reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol)
    files = files_of(await ask(reflection, request))
    assert file_name in files
    # Self-contained: a client can build every file from the one answer.
    imported = {dep for file in files.values() for dep in file.dependency}
    assert imported <= files.keys()
    assert symbol in defined_names(files[file_name])


@pytest.mark.parametrize(
    "symbol", ["agio.v1.AgentService.NoSuchMethod", "agio.v1.NoSuchService.Run", "no.such.Thing"]
)
async def test_an_unknown_symbol_is_not_found(reflection: Any, symbol: str) -> None:
    request = reflection_pb2.ServerReflectionRequest(file_containing_symbol=symbol)
    response = await ask(reflection, request)
    assert response.WhichOneof("message_response") == "error_response"
    assert response.error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]


async def test_list_names_the_agio_a2a_health_and_reflection_services(reflection: Any) -> None:
    response = await ask(reflection, reflection_pb2.ServerReflectionRequest(list_services=""))
    names = {service.name for service in response.list_services_response.service}
    assert names == {
        *SERVICE_NAMES,
        A2A_SERVICE_NAME,
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    }


@pytest.fixture
def grpcurl() -> str:
    """The grpcurl binary on PATH."""
    found = shutil.which("grpcurl")
    if found is None:
        if os.environ.get(ENV_REQUIRE_GRPCURL, "") not in ("", "0"):
            pytest.fail(f"grpcurl is required ({ENV_REQUIRE_GRPCURL} is set) but not on PATH")
        pytest.skip("grpcurl is not on PATH (docs/grpcurl.md says how to install it)")
    return found


async def run_grpcurl(grpcurl: str, *args: str) -> str:
    """grpcurl's output; fails the test on a non-zero exit. Run without blocking the event
    loop, which serves the calls."""
    process = await asyncio.create_subprocess_exec(
        grpcurl, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    async with asyncio.timeout(30):
        output, _ = await process.communicate()
    assert process.returncode == 0, output.decode()
    return output.decode()


async def test_grpcurl_describes_a_method_through_reflection(app: AgioApp, grpcurl: str) -> None:
    output = await run_grpcurl(
        grpcurl, "-plaintext", app.address, "describe", "agio.v1.AgentService.Run"
    )
    assert output.splitlines()[:2] == [
        "agio.v1.AgentService.Run is a method:",
        "rpc Run ( .agio.v1.RunRequest ) returns ( stream .agio.v1.StepEvent );",
    ]


def test_protoset_holds_the_served_services_and_every_import(tmp_path: Path) -> None:
    output = tmp_path / "agio.protoset"
    subprocess.run(
        [sys.executable, "scripts/protoset.py", "--output", output], check=True, cwd=ROOT
    )
    protoset = descriptor_pb2.FileDescriptorSet.FromString(output.read_bytes())
    files = {file.name: file for file in protoset.file}
    assert {dep for file in protoset.file for dep in file.dependency} <= files.keys()
    served = {
        f"{file.package}.{service.name}": {method.name for method in service.method}
        for file in protoset.file
        for service in file.service
    }
    generated = {
        service.full_name: set(service.methods_by_name)
        for module in (agent_service_pb2, session_service_pb2)
        for service in module.DESCRIPTOR.services_by_name.values()
    }
    assert served == generated
