"""A bare stdio MCP server (JSON-RPC by hand, no SDK) whose one tool, `garble`, writes a line
that is not a JSON-RPC message, quoting its `text`, before its result: what a server that
prints to its stdout does. The SDK's servers keep stdout for the protocol, so this one is
written out."""

from __future__ import annotations

import json
import sys
from typing import Any

GARBLE = {
    "name": "garble",
    "description": "Write a line that is not a message, then answer.",
    "inputSchema": {
        "type": "object",
        "properties": {"text": {"type": "string"}},
        "required": ["text"],
    },
}


def send(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def result_of(method: str, params: dict[str, Any]) -> dict[str, Any]:
    if method == "initialize":
        return {
            "protocolVersion": params["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "garbled", "version": "1"},
        }
    if method == "tools/list":
        return {"tools": [GARBLE]}
    if method == "tools/call":
        send(f"not a message: {params['arguments']['text']}")
        return {"content": [{"type": "text", "text": "garbled"}], "isError": False}
    return {}  # ping


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        if "id" not in request:
            continue  # a notification
        result = result_of(request["method"], request.get("params") or {})
        send(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}))


if __name__ == "__main__":
    main()
