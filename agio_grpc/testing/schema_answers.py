"""How the fake model honours a request for structured output: the smallest answer a JSON
Schema accepts, for a request whose `response_format` carries a schema (`json_schema`) or
that offers a `final_output` tool (the output schema's tool mode, engine/output.py).

`example_instance` builds the answer from the schema's own words (`const`, `enum`,
`default`, `examples`, `type`, `required` properties, `minItems`, `minLength`, `minimum`,
local `$ref`s), so a demo or a conformance run gets a valid answer with no script. Untrusted
input: a schema it cannot satisfy (a `pattern`, `not`) gets a best effort, never an error;
nesting is bounded.
"""

from __future__ import annotations

from typing import Any

FINAL_OUTPUT_TOOL = "final_output"
"""The tool the output schema's tool mode offers (engine/output.py names it too)."""
_MAX_DEPTH = 16


def requested_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The JSON Schema `response_format: json_schema` carries, else None."""
    response_format = body.get("response_format")
    if not isinstance(response_format, dict) or response_format.get("type") != "json_schema":
        return None
    json_schema = response_format.get("json_schema")
    schema = json_schema.get("schema") if isinstance(json_schema, dict) else None
    return schema if isinstance(schema, dict) else None


def final_output_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    """The parameters of the request's `final_output` tool, else None."""
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("name") == FINAL_OUTPUT_TOOL:
            parameters = function.get("parameters")
            return parameters if isinstance(parameters, dict) else {}
    return None


def example_instance(schema: object, root: object = None, depth: int = 0) -> Any:
    """The smallest value `schema` accepts, as far as its keywords say (see the module)."""
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return None
    for keyword in ("const", "default"):
        if keyword in schema:
            return schema[keyword]
    for keyword in ("enum", "examples"):
        values = schema.get(keyword)
        if isinstance(values, list) and values:
            return values[0]
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return example_instance(_pointer(root, ref), root, depth + 1)
    for keyword in ("anyOf", "oneOf", "allOf"):
        choices = schema.get(keyword)
        if isinstance(choices, list) and choices:
            return example_instance(choices[0], root, depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        return _example_object(schema, root, depth)
    if kind == "array":
        count = schema.get("minItems", 0)
        item = example_instance(schema.get("items", {}), root, depth + 1)
        return [item] * count if isinstance(count, int) and 0 < count <= 100 else []
    if kind == "string":
        length = schema.get("minLength", 0)
        return "x" * length if isinstance(length, int) and 0 < length <= 1000 else ""
    if kind in ("integer", "number"):
        return _example_number(schema)
    return False if kind == "boolean" else None


def _example_number(schema: dict[str, Any]) -> int:
    """0, or the smallest whole number above a positive minimum."""
    minimum = schema.get("minimum", schema.get("exclusiveMinimum"))
    if not isinstance(minimum, int | float) or isinstance(minimum, bool) or minimum <= 0:
        return 0
    start = minimum + 1 if "exclusiveMinimum" in schema else minimum
    return int(start) + (0 if float(start).is_integer() else 1)


def _example_object(schema: dict[str, Any], root: object, depth: int) -> dict[str, Any]:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, dict) else {}
    required = schema.get("required")
    names = (
        [name for name in required if isinstance(name, str)] if isinstance(required, list) else []
    )
    return {name: example_instance(properties.get(name, {}), root, depth + 1) for name in names}


def _pointer(root: object, ref: str) -> object:
    """The part of `root` a local `$ref` (`#/$defs/x`) points at; None when it points nowhere."""
    if not ref.startswith("#"):
        return None
    current = root
    for part in ref[1:].split("/")[1:]:
        key = part.replace("~1", "/").replace("~0", "~")
        if isinstance(current, dict):
            current = current.get(key)
        elif isinstance(current, list) and key.isdigit() and int(key) < len(current):
            current = current[int(key)]
        else:
            return None
    return current
