"""The member directory: where each server instance takes the other members' calls, and
which member runs a run (the one holding its session for it). On both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from agio_grpc.domain import StopReason, StopSignal
from agio_grpc.store.records import Member
from tests.roles import StoreRoles, open_roles
from tests.store.test_leases import start


@pytest.fixture
async def replicas(store_url: str) -> AsyncIterator[tuple[StoreRoles, StoreRoles]]:
    """Two server instances on one database."""
    first = await open_roles(store_url, instance_id="host-a/127.0.0.1:50051")
    second = await open_roles(store_url, instance_id="host-b/127.0.0.1:50051")
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


async def test_the_member_running_a_run_is_the_one_holding_its_session(
    replicas: tuple[StoreRoles, StoreRoles],
) -> None:
    first, second = replicas
    await first.register_member("10.0.0.1:7001")
    await second.register_member("10.0.0.2:7001")
    run = await start(first)
    expected = Member("host-a/127.0.0.1:50051", "10.0.0.1:7001")
    assert await first.member_running(run.id) == expected
    assert await second.member_running(run.id) == expected  # any member finds it

    ended = run.ended(StopSignal(StopReason.COMPLETED))
    await first.end_run(ended)
    assert await second.member_running(run.id) is None  # released: it runs nowhere


async def test_a_member_registering_again_replaces_its_address(
    replicas: tuple[StoreRoles, StoreRoles],
) -> None:
    first, second = replicas
    await first.register_member("10.0.0.1:7001")
    await first.register_member("10.0.0.1:7002")  # restarted on another port
    run = await start(first)
    assert await second.member_running(run.id) == Member("host-a/127.0.0.1:50051", "10.0.0.1:7002")


async def test_no_member_for_an_unknown_run_or_an_instance_that_never_registered(
    store_url: str, replicas: tuple[StoreRoles, StoreRoles]
) -> None:
    first, second = replicas
    assert await second.member_running("run_missing") is None
    assert await second.member_running("run_" + "x" * 10_000) is None
    run = await start(first)  # the first never registered an address
    assert await second.member_running(run.id) is None
    nameless = await open_roles(store_url)  # no instance id: its leases name no one
    try:
        with pytest.raises(ValueError, match="instance id"):
            await nameless.register_member("10.0.0.3:7001")
        other = await start(nameless)
        assert await second.member_running(other.id) is None
    finally:
        await nameless.close()
