// agio-grpc TypeScript client: the thin client, its errors, and the generated agio.v1 types.
export { AgioClient, outputSchemaJson, runOutput, terminalRun } from "./client.js";
export type { AgioClientOptions, CallOptions, RunResult, TlsConfig } from "./client.js";
export { AgioError, ERROR_DOMAIN, decodeError } from "./errors.js";
export { AgioTlsError, TLS_HINTS, TlsFailure } from "./tls_failure.js";
export { traceContextInterceptor } from "./tracing.js";
export { webTransport } from "./web.js";
export type { WebTransportOptions } from "./web.js";
export * from "./gen/agio/v1/agent_service_pb.js";
export * from "./gen/agio/v1/events_pb.js";
export * from "./gen/agio/v1/resources_pb.js";
export * from "./gen/agio/v1/session_service_pb.js";
