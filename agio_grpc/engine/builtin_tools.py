"""Harmless built-in tools every server offers to agents that list them.

`current_time` reads the clock, `calculate` evaluates arithmetic by walking the parsed
syntax tree (never `eval`: only numbers, + - * / // % ** and parentheses, with limits on
size), `echo` returns its input. None of them touches the network, the disk or the process,
and each returns in under a millisecond (`calculate`'s limits bound its work), so they run
`inline`, on the event loop, without a worker thread's hand-off.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from datetime import UTC, datetime

from agio_grpc.engine.tools import Tool

MAX_EXPRESSION_LENGTH = 500
MAX_NODES = 200
MAX_INTEGER_BITS = 4096
MAX_EXPONENT = 10_000

_BINARY: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[float], float]] = {
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def current_time() -> str:
    """The current date and time in UTC, ISO 8601 (e.g. 2025-01-31T12:00:00+00:00)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Supports numbers, + - * / // % ** and parentheses, e.g. "(2 + 3) * -4 / 7".

    Args:
        expression: The arithmetic expression to evaluate.
    """
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_LENGTH} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise ValueError(f"expression has more than {MAX_NODES} parts")
    return str(_evaluate(tree.body))


def echo(text: str) -> str:
    """Return the text unchanged.

    Args:
        text: The text to return.
    """
    return text


TOOLS: list[Tool] = [Tool(function, inline=True) for function in (current_time, calculate, echo)]
"""The built-in tools, registered by every server (`load_tools` reads this name)."""


def _evaluate(node: ast.expr) -> float:
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"only numbers are allowed, not {value!r}")
        return value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            result = _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
        except OverflowError:
            raise ValueError("result too large") from None
        if isinstance(result, complex):
            raise ValueError("result is not a real number")
        if isinstance(result, int) and result.bit_length() > MAX_INTEGER_BITS:
            raise ValueError("result too large")
        if isinstance(result, float) and not math.isfinite(result):
            raise ValueError("result too large")
        return result
    raise ValueError(f"unsupported syntax: {ast.unparse(node)!r}")


def _check_power(base: float, exponent: float) -> None:
    if abs(exponent) > MAX_EXPONENT:
        raise ValueError(f"exponent larger than {MAX_EXPONENT}")
    exact = isinstance(base, int) and isinstance(exponent, int) and exponent > 0
    if exact and int(base).bit_length() * exponent > MAX_INTEGER_BITS:
        raise ValueError("result too large")
