// Errors of calls the server could not serve, decoded from the gRPC status details.
import { Code, ConnectError } from "@connectrpc/connect";

import { BadRequestSchema, ErrorInfoSchema } from "./gen/google/rpc/error_details_pb.js";

/** The google.rpc.ErrorInfo domain of every agio-grpc error. */
export const ERROR_DOMAIN = "agio-grpc";

/** A call that failed: its status code, message and the server's stable ErrorInfo reason. */
export class AgioError extends Error {
  override readonly name = "AgioError";

  constructor(
    /** The gRPC status code (connect's `Code`, same numbers as gRPC). */
    readonly code: Code,
    /** The status message, without the code prefix that ConnectError adds. */
    readonly rawMessage: string,
    /** The stable ErrorInfo reason, e.g. `SESSION_NOT_FOUND`; "" when none was sent. */
    readonly reason: string = "",
    readonly domain: string = "",
    readonly metadata: Record<string, string> = {},
    /** Each invalid request field and why (google.rpc.BadRequest). */
    readonly fieldViolations: { field: string; description: string }[] = [],
    options?: { cause?: unknown },
  ) {
    super(`${Code[code]}${reason ? ` [${reason}]` : ""}: ${rawMessage}`, options);
  }

  /** The status code's name, as in the gRPC spec (`NOT_FOUND`). */
  get codeName(): string {
    return Code[this.code].replace(/([a-z])([A-Z])/g, "$1_$2").toUpperCase();
  }
}

/** An AgioError for any error a call raised (ConnectError or not). */
export function decodeError(error: unknown): AgioError {
  if (error instanceof AgioError) {
    return error;
  }
  const connect = ConnectError.from(error);
  const [info] = connect.findDetails(ErrorInfoSchema);
  const violations = connect
    .findDetails(BadRequestSchema)
    .flatMap((bad) => bad.fieldViolations)
    .map((v) => ({ field: v.field, description: v.description }));
  return new AgioError(
    connect.code,
    connect.rawMessage,
    info?.reason ?? "",
    info?.domain ?? "",
    info ? { ...info.metadata } : {},
    violations,
    { cause: error },
  );
}
