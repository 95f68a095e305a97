"""Log lines, at any level, carry no user or model content unless content capture is opted in:
tracebacks keep their frames and exception types, not the exceptions' messages, and the
libraries' DEBUG lines are left out."""

from __future__ import annotations

import io
import logging
import sys

import pytest

from agio_grpc.telemetry import trace_log_handler

USER_TEXT = "the user's secret"
MODEL_TEXT = "the model's secret reply"


def logged(capture_content: bool) -> str:
    """A traceback logged with content in its exceptions (not in the source lines shown)."""
    stream = io.StringIO()
    logger = logging.getLogger(f"tests.content.{capture_content}")
    logger.propagate = False
    handler = trace_log_handler(logging.StreamHandler(stream), capture_content=capture_content)
    logger.addHandler(handler)
    try:
        try:
            try:
                raise KeyError(USER_TEXT)
            except KeyError as error:
                raise ValueError(MODEL_TEXT) from error
        except ValueError:
            logger.exception("run %s failed", "run_1")
    finally:
        logger.removeHandler(handler)
    return stream.getvalue()


def test_a_traceback_keeps_its_frames_and_types_but_not_the_messages() -> None:
    text = logged(capture_content=False)
    assert "run run_1 failed" in text
    assert USER_TEXT not in text
    assert MODEL_TEXT not in text
    assert "builtins.KeyError: (message withheld" in text
    assert "builtins.ValueError: (message withheld" in text
    assert text.index("KeyError") < text.index("ValueError")  # oldest first, as Python does
    assert "test_log_content.py" in text
    assert "in logged" in text


@pytest.mark.parametrize("secret", [USER_TEXT, MODEL_TEXT])
def test_opted_in_content_keeps_the_messages(secret: str) -> None:
    assert secret in logged(capture_content=True)


def written(record: logging.LogRecord, *, capture_content: bool) -> str:
    """`record` as `agio-grpc serve` writes it ("" when it is left out)."""
    handler = trace_log_handler(
        logging.StreamHandler(io.StringIO()), capture_content=capture_content
    )
    return handler.format(record) if handler.filter(record) else ""


def test_a_librarys_debug_lines_are_left_out_unless_opted_in() -> None:
    quoting = logging.LogRecord(
        "mcp.client.streamable_http",
        logging.DEBUG,
        __file__,
        1,
        "SSE message: %s",
        (USER_TEXT,),
        None,
    )
    assert written(quoting, capture_content=False) == ""
    assert USER_TEXT in written(quoting, capture_content=True)
    ours = logging.LogRecord(
        "agio_grpc.engine.mcp", logging.DEBUG, __file__, 1, "transport error: %s", ("X",), None
    )
    assert written(ours, capture_content=False).endswith("transport error: X")
    warning = logging.LogRecord("mcp.client.stdio", logging.WARNING, __file__, 1, "slow", (), None)
    assert written(warning, capture_content=False).endswith("slow")


def test_a_traceback_another_handler_formatted_first_is_still_written_without_messages() -> None:
    try:
        raise ValueError(MODEL_TEXT)
    except ValueError:
        record = logging.LogRecord(
            "agio_grpc.engine.lifecycle", logging.ERROR, __file__, 1, "failed", (), sys.exc_info()
        )
    assert MODEL_TEXT in logging.Formatter().format(record)  # caches the traceback on it
    assert MODEL_TEXT not in written(record, capture_content=False)
    assert "builtins.ValueError: (message withheld" in written(record, capture_content=False)
