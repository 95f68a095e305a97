"""The Connect and gRPC-Web wire as a browser writes and reads it, over a plain HTTP client
(httpx2): end-of-stream messages, trailers and error details (the envelopes are
agio_grpc/testing/envelopes.py). The tests check the service's answers against the
protocol, not against a library that shares its code."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2

from agio_grpc.testing.envelopes import END_STREAM, TRAILERS, envelope, envelopes
from agio_grpc.v1 import events_pb2

CONNECT_JSON = {"content-type": "application/json"}
CONNECT_STREAM_JSON = {"content-type": "application/connect+json"}
CONNECT_STREAM_PROTO = {"content-type": "application/connect+proto"}
GRPC_WEB_PROTO = {"content-type": "application/grpc-web+proto", "x-grpc-web": "1"}


def json_envelope(request: Message) -> bytes:
    return envelope(json_format.MessageToJson(request).encode())


@dataclass
class WireError:
    """A Connect error as the wire carries it, its details decoded."""

    code: str
    message: str
    error_info: error_details_pb2.ErrorInfo | None = None
    bad_request: error_details_pb2.BadRequest | None = None
    detail_types: list[str] = field(default_factory=list)


def wire_error(body: dict[str, Any]) -> WireError:
    """A Connect error body (unary) or the `error` of an EndStreamResponse."""
    error = WireError(code=body["code"], message=body.get("message", ""))
    for detail in body.get("details", []):
        error.detail_types.append(detail["type"])
        value = base64.b64decode(detail["value"] + "=" * (-len(detail["value"]) % 4))
        if detail["type"] == "google.rpc.ErrorInfo":
            error.error_info = error_details_pb2.ErrorInfo.FromString(value)
        elif detail["type"] == "google.rpc.BadRequest":
            error.bad_request = error_details_pb2.BadRequest.FromString(value)
    return error


@dataclass
class ConnectStream:
    """A Connect server stream read to its end: its events and its end-of-stream error."""

    events: list[events_pb2.StepEvent]
    error: WireError | None


def connect_stream(data: bytes, *, binary: bool) -> ConnectStream:
    found = envelopes(data)
    *messages, (last_flags, last) = found
    assert last_flags == END_STREAM, "a Connect stream ends with an end-of-stream message"
    events = []
    for flags, payload in messages:
        assert flags == 0
        if binary:
            events.append(events_pb2.StepEvent.FromString(payload))
        else:
            events.append(json_format.Parse(payload, events_pb2.StepEvent()))
    end = json.loads(last)
    return ConnectStream(events, wire_error(end["error"]) if "error" in end else None)


@dataclass
class GrpcWebStream:
    events: list[events_pb2.StepEvent]
    trailers: dict[str, str]

    def status_details(self) -> status_pb2.Status:
        encoded = self.trailers["grpc-status-details-bin"]
        return status_pb2.Status.FromString(base64.b64decode(encoded + "=" * (-len(encoded) % 4)))


def grpc_web_stream(data: bytes) -> GrpcWebStream:
    *messages, (last_flags, last) = envelopes(data)
    assert last_flags == TRAILERS, "a gRPC-Web response ends with its trailers"
    trailers = {}
    for line in last.decode().split("\r\n"):
        if line:
            key, _, value = line.partition(":")
            trailers[key.strip().lower()] = value.strip()
    return GrpcWebStream([events_pb2.StepEvent.FromString(p) for _, p in messages], trailers)
