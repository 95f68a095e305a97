"""bench.profile's tables: a py-spy stack goes to the component of its innermost frame and,
on the event loop's thread, to the role the run was playing."""

from __future__ import annotations

from pathlib import Path

from bench.profile import ROLES, component, role, summarize

LOOP = (
    "thread (7): MainThread;<module> (agio_grpc/cli/__main__.py:3);"
    "cmd_serve (agio_grpc/cli/serve.py:83)"
)
STORE, MODEL, RELAY = (name for name, _ in ROLES)


def stack(*frames: str, thread: str = LOOP) -> str:
    return ";".join((thread, *frames))


def test_a_store_write_under_the_run_loop_is_the_stores() -> None:
    write = stack(
        "RunLoop._finish (agio_grpc/engine/loop.py:500)",
        "_Instrumented._timed.<locals>.call (agio_grpc/telemetry/store.py:94)",
        "SqliteDatabase.run (agio_grpc/store/database.py:262)",
        "do_commit (sqlalchemy/engine/default.py:954)",
    )
    assert role(write) == STORE
    assert component(write) == "SQLAlchemy"


def test_a_delta_published_from_the_model_stream_is_the_model_calls() -> None:
    delta = stack(
        "OpenAIModelDriver._stream (agio_grpc/engine/models/openai_chat.py:183)",
        "RunChannel.publish (agio_grpc/engine/channel.py:86)",
    )
    assert role(delta) == MODEL
    assert component(delta) == "agio_grpc.engine"


def test_the_relay_tracing_the_engine_and_the_loop_itself() -> None:
    assert role(stack("AgentServicer._relay (agio_grpc/service/agent_service.py:295)")) == RELAY
    span = stack(
        "AgentServicer.Run (agio_grpc/service/agent_service.py:120)",
        "OtelRunTracer.start_run (agio_grpc/telemetry/runs.py:40)",
    )
    assert role(span).startswith("tracing")
    checks = stack(
        "TracingInterceptor._traced.<locals>.wrap.<locals>.handler "
        "(agio_grpc/telemetry/grpc_server.py:73)",
        "AgentServicer.run_input (agio_grpc/service/agent_service.py:200)",
    )
    assert role(checks).startswith("the engine and the service")
    assert role(stack("BaseEventLoop._run_once (asyncio/base_events.py:1922)")).startswith(
        "the event loop itself"
    )


def test_only_the_event_loop_threads_samples_have_roles(tmp_path: Path) -> None:
    collapsed = tmp_path / "short.txt"
    writer = "thread (9): agio-sqlite-writer_0;_worker (concurrent/futures/thread.py:83)"
    collapsed.write_text(
        f"{stack('AgentServicer._relay (agio_grpc/service/agent_service.py:295)')} 3\n"
        f"{stack('BaseEventLoop._run_once (asyncio/base_events.py:1922)')} 2\n"
        f"{writer} 5\n"
    )
    components, roles = summarize(collapsed)
    assert sum(components.values()) == 10
    assert roles[RELAY] == 3
    assert sum(roles.values()) == 5
