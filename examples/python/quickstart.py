"""Run "What is 12 * 7?" to its end, then list the session's stored steps."""

import asyncio
import os

from agio_grpc.client import AgioClient
from agio_grpc.v1.resources_pb2 import Role, StopReason


async def main() -> None:
    async with AgioClient(os.environ.get("AGIO_ADDRESS", "127.0.0.1:50051")) as client:
        result = await client.run_to_end("What is 12 * 7?")
        print(result.text, StopReason.Name(result.stop_signal.reason))
        for step in await client.list_steps(result.session_id):
            calls = ", ".join(f"{call.name}({call.arguments})" for call in step.tool_calls)
            print(step.sequence, Role.Name(step.role), step.content or calls)


asyncio.run(main())
