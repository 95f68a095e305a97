// The web transport: agio-grpc's HTTP listener (AGIO_HTTP_ADDRESS) over the Connect protocol
// or gRPC-Web, on fetch (@connectrpc/connect-web). It works in browsers and in Node 20+, and
// imports nothing of Node: a page can bundle it with the generated services.
import type { Interceptor, Transport } from "@connectrpc/connect";
import { createConnectTransport, createGrpcWebTransport } from "@connectrpc/connect-web";

import { bearerToken } from "./auth.js";
import { traceContextInterceptor } from "./tracing.js";

export interface WebTransportOptions {
  /** `connect` (the default) or `grpc-web`. */
  protocol?: "connect" | "grpc-web";
  /** Send protobuf binary rather than JSON (Connect sends JSON by default, gRPC-Web binary). */
  useBinaryFormat?: boolean;
  /** Sent as `authorization: Bearer <token>` with every call. */
  token?: string;
  /** Extra connect interceptors, called after the trace-context and token ones. */
  interceptors?: Interceptor[];
  /** The fetch to call with (default: the global one). */
  fetch?: typeof globalThis.fetch;
}

/**
 * A transport to the HTTP listener at `baseUrl` (`http://127.0.0.1:8080`), for `new
 * AgioClient(webTransport(url))` or connect's `createClient(AgentService, webTransport(url))`.
 * It injects the active OpenTelemetry context (`traceparent`) as the gRPC transport does.
 */
export function webTransport(baseUrl: string, options: WebTransportOptions = {}): Transport {
  const interceptors = [
    traceContextInterceptor,
    ...(options.token ? [bearerToken(options.token)] : []),
    ...(options.interceptors ?? []),
  ];
  const common = { baseUrl, interceptors, fetch: options.fetch };
  if (options.protocol === "grpc-web") {
    return createGrpcWebTransport({ ...common, useBinaryFormat: options.useBinaryFormat ?? true });
  }
  return createConnectTransport({ ...common, useBinaryFormat: options.useBinaryFormat ?? false });
}

export { AgioError, ERROR_DOMAIN, decodeError } from "./errors.js";
export { traceContextInterceptor } from "./tracing.js";
export * from "./gen/agio/v1/agent_service_pb.js";
export * from "./gen/agio/v1/events_pb.js";
export * from "./gen/agio/v1/resources_pb.js";
export * from "./gen/agio/v1/session_service_pb.js";
