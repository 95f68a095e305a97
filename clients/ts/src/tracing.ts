// OpenTelemetry propagation for the TypeScript client: a connect interceptor.
import { context, propagation } from "@opentelemetry/api";
import type { Interceptor } from "@connectrpc/connect";

/**
 * Injects the active OpenTelemetry context (W3C `traceparent`, with the propagator the
 * application registered) into every call's headers, so the server's run joins the caller's
 * trace. Without a registered propagator or an active span it adds nothing.
 */
export const traceContextInterceptor: Interceptor = (next) => async (req) => {
  propagation.inject(context.active(), req.header, {
    set: (carrier, key, value) => carrier.set(key, value),
  });
  return next(req);
};
