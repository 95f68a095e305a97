// The caller's credential on every call, whatever the transport.
import type { Interceptor } from "@connectrpc/connect";

/** Sends `authorization: Bearer <token>` with every call. */
export function bearerToken(token: string): Interceptor {
  return (next) => async (request) => {
    request.header.set("authorization", `Bearer ${token}`);
    return next(request);
  };
}
