"""Server settings reach gRPC as the channel arguments they name."""

from __future__ import annotations

from agio_grpc.config import ServerConfig
from agio_grpc.service.server import server_options


def test_queued_calls_wait_for_the_callers_deadline_not_grpcs_30_s() -> None:
    options = dict(server_options(ServerConfig()))
    assert options["grpc.server_max_unrequested_time_in_server"] == 3600
    tuned = dict(server_options(ServerConfig(max_call_queue_time_s=5)))
    assert tuned["grpc.server_max_unrequested_time_in_server"] == 5


def test_a_second_server_cannot_share_the_port_silently() -> None:
    assert dict(server_options(ServerConfig()))["grpc.so_reuseport"] == 0
