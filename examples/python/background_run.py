"""Start a run no caller holds, then follow its events from a cursor to the end."""

import asyncio
import os

from agio_grpc.client import AgioClient
from agio_grpc.v1.resources_pb2 import RunStatus


async def main() -> None:
    async with AgioClient(os.environ.get("AGIO_ADDRESS", "127.0.0.1:50051")) as client:
        run = await client.start_run("What is 6 * 7?")
        print(run.id, RunStatus.Name(run.status))
        # follow_run reconnects from the last seq it saw when the server restarts.
        async for event in client.follow_run(run.id, after_seq=0):
            print(event.seq, event.WhichOneof("event"))


asyncio.run(main())
