"""Structured output: a run whose final answer is JSON valid against a schema.

An `OutputSpec` (an agent's `output_schema`, or a run's `output_schema_json`, with the
agent's `output_mode` and `output_retries`) travels with the run's settings, so a retry or a
continuation validates against the same schema. Here:

- `checked_schema`: is a schema acceptable at all (before any run starts): a JSON object of
  at most 64 KiB and 32 levels, valid against its metaschema, with local `$ref`s only (no
  network, ever) that resolve, and `pattern`s that cannot backtrack catastrophically;
- `request_shape`: how a model call carries the schema (`response_format`, a system note,
  or a `final_output` tool);
- `final_answer`: the reply's answer text (a `final_output` call's arguments in tool mode);
- `check_answer`: parse and validate an answer, giving the value or the errors;
- `repair_message`: what the model is told when its answer was invalid.

Hostile schemas: Python's `re` (which jsonschema uses for `pattern` and
`patternProperties`) backtracks, so a pattern such as `(a+)+$` against a long answer can
run for hours. A pattern is refused when it is longer than 256 characters, holds a
backreference, or nests a repeat inside a repeat (star height above 1, the shape of every
classic catastrophic pattern); an answer is also never larger than the step limit. What
remains possible (an alternation of overlapping branches under one repeat) is polynomial at
worst, not exponential in the usual cases.

Never imports grpc, SQLAlchemy or OpenTelemetry, and does no I/O.
"""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any, Literal

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from jsonschema.validators import validator_for
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from agio_grpc.domain import Role, Step, StopReason, StopSignal
from agio_grpc.engine.models import ModelReply

OutputMode = Literal["json_schema", "json_object", "tool"]
"""How a model call carries the schema: `response_format: json_schema` (strict), or
`response_format: json_object` with the schema in a system note, or a `final_output` tool
whose parameters are the schema (for servers that know neither)."""

FINAL_OUTPUT_TOOL = "final_output"
"""The tool a model calls with its answer in `tool` mode."""
MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 32
MAX_PATTERN_CHARS = 256
MAX_REPORTED_ERRORS = 5
"""Validation errors kept for the repair message and the stop signal (the first by path)."""
_MAX_ERROR_CHARS = 300
_SCHEMA_NAME = "final_answer"


class OutputSchemaError(ValueError):
    """A schema that cannot be an output schema; the message says why."""


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """What a run's final answer must be, and how the model is asked for it."""

    schema: dict[str, Any]
    """The JSON Schema (checked by `checked_schema`)."""
    mode: OutputMode = "json_schema"
    retries: int = 1
    """Repair calls after an invalid answer before the run stops OUTPUT_INVALID."""


# -- the schema ------------------------------------------------------------------------------


def schema_from_text(text: str) -> dict[str, Any]:
    """The schema JSON text holds, checked (`checked_schema`). Raises OutputSchemaError."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SCHEMA_BYTES:
        raise OutputSchemaError(f"must be at most {MAX_SCHEMA_BYTES} bytes")
    if _nesting_over(text, MAX_SCHEMA_DEPTH):
        raise OutputSchemaError(f"must not nest more than {MAX_SCHEMA_DEPTH} levels deep")
    try:
        schema = json.loads(text)
    except ValueError as error:
        raise OutputSchemaError(f"is not valid JSON: {error}") from None
    return checked_schema(schema)


def checked_schema(schema: object) -> dict[str, Any]:
    """`schema` if it can be an output schema (see the module docstring), else OutputSchemaError."""
    if not isinstance(schema, dict):
        raise OutputSchemaError("must be a JSON object (a JSON Schema)")
    text = json.dumps(schema)
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        raise OutputSchemaError(f"must be at most {MAX_SCHEMA_BYTES} bytes")
    if _nesting_over(text, MAX_SCHEMA_DEPTH):
        raise OutputSchemaError(f"must not nest more than {MAX_SCHEMA_DEPTH} levels deep")
    validator = _validator_class(schema)
    try:
        validator.check_schema(schema)
    except SchemaError as error:
        where = "/" + "/".join(str(part) for part in error.absolute_path)
        problem = f"is not a valid JSON Schema: at {where}: {error.message}"
        raise OutputSchemaError(problem) from None
    _check_references(schema)
    for pattern in _patterns(schema):
        _check_pattern(pattern)
    return schema


def _validator_class(schema: dict[str, Any]) -> type[Validator]:
    # A `$schema` that is not a string is left to the default metaschema to refuse.
    if isinstance(schema.get("$schema"), str):
        return validator_for(schema, default=Draft202012Validator)
    return Draft202012Validator


def _nesting_over(text: str, limit: int) -> bool:
    depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False


def _walk(value: object) -> Iterator[dict[str, Any]]:
    """Every object within `value`, without recursion."""
    pending = [value]
    while pending:
        current = pending.pop()
        if isinstance(current, dict):
            yield current
            pending.extend(current.values())
        elif isinstance(current, list):
            pending.extend(current)


def _check_references(schema: dict[str, Any]) -> None:
    resource: Resource[Any] = Resource.from_contents(schema, default_specification=DRAFT202012)
    base = resource.id() or ""
    resolver = Registry().with_resource(base, resource).resolver(base_uri=base)
    for node in _walk(schema):
        for key in ("$ref", "$dynamicRef"):
            ref = node.get(key)
            if not isinstance(ref, str):
                continue
            if not ref.startswith("#"):
                raise OutputSchemaError(
                    f"{key} {ref[:80]!r}: only references within the schema (#...) are allowed"
                )
            try:
                resolver.lookup(ref)
            except Unresolvable:
                problem = f"{key} {ref[:80]!r} does not resolve in the schema"
                raise OutputSchemaError(problem) from None


def _patterns(schema: dict[str, Any]) -> Iterator[str]:
    for node in _walk(schema):
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            yield pattern
        properties = node.get("patternProperties")
        if isinstance(properties, dict):
            yield from properties


def _check_pattern(pattern: str) -> None:
    shown = pattern[:80]
    if len(pattern) > MAX_PATTERN_CHARS:
        problem = f"pattern {shown!r}... is longer than {MAX_PATTERN_CHARS} characters"
        raise OutputSchemaError(problem)
    try:
        parsed = _parse_pattern(pattern)
    except re.error as error:
        raise OutputSchemaError(
            f"pattern {shown!r} is not a valid regular expression: {error}"
        ) from None
    if _has_backreference(parsed):
        raise OutputSchemaError(f"pattern {shown!r}: backreferences are not allowed")
    if _star_height(parsed) > 1:
        raise OutputSchemaError(
            f"pattern {shown!r}: a repeat inside a repeat may backtrack catastrophically"
        )


def _parse_pattern(pattern: str) -> list[Any]:
    # The stdlib's own parser (untyped): the tree `re` compiles, so what is judged is what
    # would run.
    parser = importlib.import_module("re._parser")
    return list(parser.parse(pattern))


_REPEATS = frozenset({"MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"})


def _nodes(tree: list[Any]) -> Iterator[tuple[str, Any]]:
    for opcode, argument in tree:
        yield str(opcode), argument


def _children(opcode: str, argument: Any) -> list[list[Any]]:
    """The subpatterns of one parsed node."""
    if opcode in _REPEATS:
        return [list(argument[2])]
    if opcode == "SUBPATTERN":
        return [list(argument[-1])]
    if opcode == "BRANCH":
        return [list(branch) for branch in argument[1]]
    if opcode in ("ASSERT", "ASSERT_NOT"):
        return [list(argument[1])]
    if opcode == "ATOMIC_GROUP":
        return [list(argument)]
    if opcode == "GROUPREF_EXISTS":
        return [list(part) for part in argument[1:] if part is not None]
    return []


def _star_height(tree: list[Any]) -> int:
    """How deeply variable repeats (`*`, `+`, `?`, `{m,n}`) nest in `tree`."""
    height = 0
    for opcode, argument in _nodes(tree):
        inner = max((_star_height(child) for child in _children(opcode, argument)), default=0)
        # A fixed count (`x{3}`) matches one way; only a variable one can backtrack.
        repeats = opcode in _REPEATS and argument[1] > argument[0]
        height = max(height, inner + (1 if repeats else 0))
    return height


def _has_backreference(tree: list[Any]) -> bool:
    for opcode, argument in _nodes(tree):
        if opcode in ("GROUPREF", "GROUPREF_EXISTS"):
            return True
        if any(_has_backreference(child) for child in _children(opcode, argument)):
            return True
    return False


# -- the model call --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestShape:
    """What a model call of a run with an output schema adds to its request."""

    response_format: dict[str, Any] | None = None
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | None = None
    system_note: str = ""
    """A system message added after the instructions (json_object mode: the schema)."""


def request_shape(spec: OutputSpec) -> RequestShape:
    """How every model call of the run carries `spec` (any call may be the final one)."""
    if spec.mode == "json_schema":
        return RequestShape(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": _SCHEMA_NAME, "schema": spec.schema, "strict": True},
            }
        )
    if spec.mode == "json_object":
        return RequestShape(
            response_format={"type": "json_object"},
            system_note=(
                "Give your final answer as one JSON value, and nothing else, valid against "
                f"this JSON Schema:\n{json.dumps(spec.schema)}"
            ),
        )
    tool = {
        "type": "function",
        "function": {
            "name": FINAL_OUTPUT_TOOL,
            "description": "Give the final answer: call this once, with the answer as arguments.",
            "parameters": spec.schema,
        },
    }
    # `required`: an answer in text would escape the schema the tool's arguments carry.
    return RequestShape(tools=(tool,), tool_choice="required")


# -- the answer ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CheckedAnswer:
    """An answer checked against the schema: its value as compact JSON, or the errors."""

    output_json: str = ""
    errors: tuple[str, ...] = ()
    """What is wrong, for the model and the caller: the messages quote the answer."""
    failed_checks: tuple[str, ...] = ()
    """The same errors without the answer's content (`$.city: type`, `not JSON`), for
    telemetry, which must not carry content unless asked to."""

    @property
    def valid(self) -> bool:
        return not self.errors


_FENCE = re.compile(r"\A\s*```(?:json)?\s*\n(.*)\n\s*```\s*\Z", re.DOTALL)


def check_answer(spec: OutputSpec, text: str) -> CheckedAnswer:
    """Parse `text` (one fenced ```json block is accepted too) and validate it."""
    fenced = _FENCE.match(text)
    body = fenced.group(1) if fenced else text
    if _nesting_over(body, 2 * MAX_SCHEMA_DEPTH + 64):
        return CheckedAnswer(
            errors=("the answer nests too deeply to be read",), failed_checks=("too deep",)
        )
    try:
        value = json.loads(body)
    except json.JSONDecodeError as error:
        return CheckedAnswer(
            errors=(f"the answer is not JSON: {error}",), failed_checks=("not JSON",)
        )
    except ValueError:  # an integer of more digits than Python reads (4,300)
        return CheckedAnswer(
            errors=("the answer holds a number too long to be read",),
            failed_checks=("number too long",),
        )
    validator = _validator_class(spec.schema)(spec.schema)
    found = sorted(validator.iter_errors(value), key=lambda error: list(map(str, error.path)))
    if found:
        kept = found[:MAX_REPORTED_ERRORS]
        return CheckedAnswer(
            errors=tuple(_describe(error.json_path, error.message) for error in kept),
            failed_checks=tuple(f"{error.json_path}: {error.validator}" for error in kept),
        )
    return CheckedAnswer(output_json=json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def _describe(path: str, message: str) -> str:
    if len(message) > _MAX_ERROR_CHARS:
        message = message[: _MAX_ERROR_CHARS - 3] + "..."
    return f"at {path}: {message}"


def repair_message(spec: OutputSpec, errors: tuple[str, ...]) -> str:
    """The user message asking the model again after an invalid answer."""
    listed = "\n".join(f"- {error}" for error in errors)
    how = (
        f"Call the {FINAL_OUTPUT_TOOL} tool again with corrected arguments."
        if spec.mode == "tool"
        else "Answer again with only the corrected JSON."
    )
    return f"Your answer is not valid against the required JSON Schema:\n{listed}\n{how}"


# -- the run ---------------------------------------------------------------------------------


def answer_of(spec: OutputSpec | None, reply: ModelReply) -> ModelReply:
    """The reply as its step is stored: in tool mode, a `final_output` call becomes the
    step's text (its arguments, the raw JSON) and the reply's calls are dropped, since the
    answer ends the run and a call left without a result would break the session's history."""
    if spec is None or spec.mode != "tool":
        return reply
    final = next((call for call in reply.tool_calls if call.name == FINAL_OUTPUT_TOOL), None)
    if final is None:
        return reply
    return replace(reply, content=final.arguments, tool_calls=[])


@dataclass(slots=True)
class OutputAttempts:
    """A run segment's answers against its schema: the repairs asked, the last errors."""

    spec: OutputSpec
    repairs: int = 0
    """Repair calls asked for so far."""
    errors: tuple[str, ...] = ()
    """The errors of the last invalid answer."""

    def check(self, answer: Step) -> CheckedAnswer:
        """Check an answer step's text, keeping its errors."""
        checked = check_answer(self.spec, answer.content)
        self.errors = checked.errors
        return checked

    def may_repair(self) -> bool:
        return self.repairs < self.spec.retries

    def repair_step(self, answer: Step) -> Step:
        """The user step asking again, with the errors of `answer` (one repair used)."""
        self.repairs += 1
        return Step(
            answer.session_id,
            answer.run_id,
            Role.USER,
            content=repair_message(self.spec, self.errors),
        )

    def invalid_signal(self, answer: Step) -> StopSignal:
        """OUTPUT_INVALID for `answer`, the last one: retryable from it (a Retry at its
        sequence asks the model again, with the same schema)."""
        return StopSignal(
            StopReason.OUTPUT_INVALID,
            f"the final answer is not valid against the output schema "
            f"({self.repairs} repair call(s) made)",
            "model",
            context={"errors": list(self.errors), "repairs": self.repairs},
            retryable=True,
            resume_from_sequence=answer.sequence,
        )
