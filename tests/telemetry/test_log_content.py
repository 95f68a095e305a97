"""Log lines carry no user or model content unless content capture is opted in: tracebacks
keep their frames and exception types, not the exceptions' messages."""

from __future__ import annotations

import io
import logging

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
