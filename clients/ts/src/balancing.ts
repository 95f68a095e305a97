// Round robin over several agio-grpc servers. connect-node's gRPC transport reaches one base
// URL over one HTTP/2 session and has no load-balancing policy (gRPC's `round_robin` is a
// feature of the Go and C-core channels), so the client makes one transport per server and
// sends each call to the next one in turn. Unlike gRPC's round_robin it does not skip a
// server that is down: a call sent to it fails with UNAVAILABLE, the next goes elsewhere.
import { lookup } from "node:dns/promises";

import type { Transport } from "@connectrpc/connect";

/**
 * The servers a target names: several `host:port` (or URLs) separated by commas, as
 * AGIO_ADDRESS holds them, or a list; a `dns:///host:port` target stays one entry (see
 * `dnsTarget`).
 */
export function addresses(target: string | readonly string[]): string[] {
  const parts = (typeof target === "string" ? target.split(",") : target.flatMap((t) => t.split(",")))
    .map((part) => part.trim())
    .filter((part) => part !== "");
  if (parts.length === 0) {
    throw new Error("no server address given");
  }
  return parts;
}

/** `{host, port}` of a `dns:///host:port` target (`dns://authority/host:port` too), else undefined. */
export function dnsTarget(address: string): { host: string; port: string } | undefined {
  const found = /^dns:\/\/[^/]*\/(.+):(\d+)$/.exec(address);
  if (!found) return undefined;
  return { host: found[1].replace(/^\[(.*)\]$/, "$1"), port: found[2] };
}

/** A transport that sends each call to the next of `transports`, in turn. */
export function roundRobin(transports: readonly Transport[]): Transport {
  if (transports.length === 1) return transports[0];
  let next = 0;
  const pick = (): Transport => {
    const chosen = transports[next];
    next = (next + 1) % transports.length;
    return chosen;
  };
  return {
    unary: (method, signal, timeoutMs, header, input, contextValues) =>
      pick().unary(method, signal, timeoutMs, header, input, contextValues),
    stream: (method, signal, timeoutMs, header, input, contextValues) =>
      pick().stream(method, signal, timeoutMs, header, input, contextValues),
  };
}

/**
 * A transport over every address `host` resolves to (one transport each, made by `make` for
 * `ip:port`), round robin. The name is resolved at the first call; the calls wait for it.
 */
export function resolvedRoundRobin(
  host: string,
  port: string,
  make: (address: string) => Transport,
): Transport {
  let resolved: Promise<Transport> | undefined;
  const transport = (): Promise<Transport> => {
    resolved ??= lookup(host, { all: true }).then((found) =>
      roundRobin(
        found.map(({ address, family }) => make(family === 6 ? `[${address}]:${port}` : `${address}:${port}`)),
      ),
    );
    return resolved;
  };
  return {
    unary: async (method, signal, timeoutMs, header, input, contextValues) =>
      (await transport()).unary(method, signal, timeoutMs, header, input, contextValues),
    stream: async (method, signal, timeoutMs, header, input, contextValues) =>
      (await transport()).stream(method, signal, timeoutMs, header, input, contextValues),
  };
}
