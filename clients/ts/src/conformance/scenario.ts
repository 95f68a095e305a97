// The client conformance scenario, TypeScript edition; the same checks, with the same names,
// as tests/conformance/scenario.py (which documents them) and clients/go/conformance_test.go.
// scripts/conformance.py starts the servers and runs:
//   node dist/conformance/scenario.js --address HOST:PORT --slow-address HOST:PORT
// and once more with `--protocol connect` against the servers' HTTP listeners.
// For its runs over TLS it also sets what the CLIs read: AGIO_CA_FILE (and for mutual TLS
// AGIO_CERT_FILE and AGIO_KEY_FILE), and AGIO_TOKEN.
// Prints `ok NAME` or `FAIL NAME: why` per check; exits 1 when any check failed.
import { randomBytes } from "node:crypto";
import { parseArgs } from "node:util";

import { context, propagation, trace, TraceFlags } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";

import {
  AgioClient,
  AgioError,
  AgioTlsError,
  ERROR_DOMAIN,
  TlsFailure,
  RunStatus,
  StopReason,
  terminalRun,
  webTransport,
} from "../index.js";
import type { AgioClientOptions, Run, StepEvent } from "../index.js";

const CALL_TIMEOUT_MS = 10_000;
/** gRPC on the gRPC port; Connect or gRPC-Web on the HTTP listener (AGIO_HTTP_ADDRESS). */
const PROTOCOLS = ["grpc", "connect", "grpc-web"] as const;
type Protocol = (typeof PROTOCOLS)[number];
const RUN_TIMEOUT_MS = 30_000;
const PAGE_SIZE = 2;
/** The built-in fake model answers it with its smallest instance, after its calculate call. */
const ANSWER_SCHEMA = {
  type: "object",
  properties: { answer: { type: "integer" } },
  required: ["answer"],
  additionalProperties: false,
};

class CheckFailedError extends Error {
  override readonly name = "CheckFailedError";
}

function expect(condition: boolean, message: string): asserts condition {
  if (!condition) {
    throw new CheckFailedError(message);
  }
}

function withTimeout<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new CheckFailedError(`timed out after ${ms} ms`)), ms);
  });
  return Promise.race([promise, timeout]).finally(() => clearTimeout(timer));
}

/** The token and TLS files of a run over TLS, from the variables the CLIs read. */
function connectionFromEnv(): AgioClientOptions {
  const env = process.env;
  const tls = {
    caFile: env.AGIO_CA_FILE,
    certFile: env.AGIO_CERT_FILE,
    keyFile: env.AGIO_KEY_FILE,
  };
  return {
    token: env.AGIO_TOKEN || undefined,
    tls: tls.caFile || tls.certFile || tls.keyFile ? tls : false,
  };
}

class Scenario {
  private readonly client: AgioClient;
  private readonly slow: AgioClient;
  private readonly address: string;
  private readonly options: AgioClientOptions;
  private readonly traceId = randomBytes(16).toString("hex");
  private toolRun: Run | undefined;

  constructor(address: string, slowAddress: string, protocol: Protocol) {
    const options = { ...connectionFromEnv(), timeoutMs: CALL_TIMEOUT_MS };
    this.address = address;
    this.options = options;
    const client = (target: string) =>
      protocol === "grpc"
        ? new AgioClient(target, options)
        : new AgioClient(
            webTransport(`http://${target}`, { protocol, token: options.token }),
            options,
          );
    this.client = client(address);
    this.slow = client(slowAddress);
  }

  async health(): Promise<void> {
    const status = await this.client.checkHealth();
    expect(status === "SERVING", `health is ${status}`);
  }

  async runWithTool(): Promise<void> {
    // The trace context travels the way an instrumented application sends it: the client's
    // interceptor injects the active OpenTelemetry context with the registered propagator.
    const parent = trace.setSpanContext(context.active(), {
      traceId: this.traceId,
      spanId: randomBytes(8).toString("hex"),
      traceFlags: TraceFlags.SAMPLED,
      isRemote: true,
    });
    const events: StepEvent[] = await context.with(parent, async () => {
      const collected: StepEvent[] = [];
      for await (const event of this.client.run(
        { input: "What is 12 * 7?" },
        { timeoutMs: RUN_TIMEOUT_MS },
      )) {
        collected.push(event);
      }
      return collected;
    });
    expect(events.length > 0, "no events");
    expect(
      events.every((event, i) => event.seq === BigInt(i + 1)),
      "seq is not gapless from 1",
    );
    const last = events[events.length - 1];
    expect(last.event.case === "runCompleted", `the stream ended with ${last.event.case}`);
    const run = last.event.value.run;
    expect(run !== undefined, "runCompleted without a run");
    this.toolRun = run;
    const calls = events.flatMap((e) =>
      e.event.case === "stepCompleted" ? (e.event.value.step?.toolCalls ?? []) : [],
    );
    expect(
      calls.map((c) => c.name).join(",") === "calculate",
      `tool calls ${calls.map((c) => c.name)}`,
    );
    const reason = run.stopSignal?.reason ?? StopReason.UNSPECIFIED;
    expect(reason === StopReason.COMPLETED, `stop reason ${StopReason[reason]}`);
  }

  async traceIdCheck(): Promise<void> {
    expect(this.toolRun !== undefined, "no run to check (run_with_tool failed)");
    const stored = await this.client.getRun(this.toolRun.id);
    expect(
      this.toolRun.traceId === this.traceId && stored?.traceId === this.traceId,
      `sent trace id ${this.traceId}, run has "${this.toolRun.traceId}" (GetRun "${stored?.traceId}")`,
    );
  }

  async cancel(): Promise<void> {
    let cancelled = false;
    let terminal: Run | undefined;
    for await (const event of this.slow.run(
      { input: "Tell me a long story." },
      { timeoutMs: RUN_TIMEOUT_MS },
    )) {
      if (!cancelled && event.event.case === "stepDelta" && event.event.value.content) {
        cancelled = true;
        await this.slow.cancelRun(event.runId, "conformance");
      }
      terminal = terminalRun(event) ?? terminal;
    }
    expect(cancelled, "no text was streamed before the end");
    expect(terminal !== undefined, "no terminal event");
    const reason = terminal.stopSignal?.reason ?? StopReason.UNSPECIFIED;
    expect(reason === StopReason.CANCELLED, `stop reason ${StopReason[reason]}`);
    const stored = await this.slow.getRun(terminal.id);
    const status = stored?.status ?? RunStatus.UNSPECIFIED;
    expect(status === RunStatus.CANCELLED, `GetRun status ${RunStatus[status]}`);
  }

  async notFound(): Promise<void> {
    try {
      for await (const _ of this.client.run(
        { input: "hi", sessionId: "no-such-session" },
        { timeoutMs: RUN_TIMEOUT_MS },
      )) {
        // A run on an unknown session must fail before any event.
      }
    } catch (error) {
      expect(error instanceof AgioError, `not an AgioError: ${String(error)}`);
      expect(error.codeName === "NOT_FOUND", `code ${error.codeName}`);
      expect(error.reason === "SESSION_NOT_FOUND", `reason "${error.reason}"`);
      expect(error.domain === ERROR_DOMAIN, `domain "${error.domain}"`);
      return;
    }
    throw new CheckFailedError("the run on an unknown session did not fail");
  }

  async backgroundResume(): Promise<void> {
    const run = await this.client.startRun({ input: "What is 12 * 7?" });
    expect(run !== undefined, "StartRun returned no run");
    // Read two events, drop the stream, resume from the cursor to the terminal event.
    const seen: StepEvent[] = [];
    for await (const event of this.client.watchRun(run.id)) {
      seen.push(event);
      if (seen.length === 2) break;
    }
    expect(seen.length === 2 && seen[0].event.case === "runStarted", "the first two events");
    const cursor = seen[1].seq;
    const rest: StepEvent[] = [];
    for await (const event of this.client.followRun(run.id, cursor, 3)) rest.push(event);
    expect(rest.length > 0 && rest[0].seq > cursor, `resumed from ${cursor}`);
    const final = terminalRun(rest[rest.length - 1]);
    expect(
      final?.stopSignal?.reason === StopReason.COMPLETED,
      `the resumed stream ended with ${rest[rest.length - 1]?.event.case}`,
    );
  }

  async followAfterEnd(): Promise<void> {
    const run = await this.client.startRun({ input: "What is 12 * 7?" });
    expect(run !== undefined, "StartRun returned no run");
    let terminalSeq = 0n;
    for await (const event of this.client.followRun(run.id, 0n, 3)) terminalSeq = event.seq;
    let after = 0;
    for await (const _ of this.client.followRun(run.id, terminalSeq, 3)) after++;
    expect(terminalSeq > 0n && after === 0, `${after} events after terminal seq ${terminalSeq}`);
  }

  /** The other transport: TLS to a plaintext server, plaintext to a TLS one (gRPC only). */
  async tlsHint(): Promise<void> {
    const plaintext = this.options.tls === false;
    const wrong = new AgioClient(this.address, { ...this.options, tls: plaintext });
    const expected = plaintext ? TlsFailure.ServerWithoutTls : TlsFailure.ServerWantsTls;
    try {
      await wrong.checkHealth();
    } catch (error) {
      expect(error instanceof AgioTlsError, `no TLS failure in ${String(error)}`);
      expect(error.tlsFailure === expected, `${error.tlsFailure}: ${error.message}`);
      expect(error.message.includes("AGIO_CA_FILE"), `no AGIO_CA_FILE in ${error.message}`);
      return;
    }
    throw new CheckFailedError("a client with the wrong TLS got in");
  }

  async structuredOutput(): Promise<void> {
    const result = await this.client.runForOutput({ input: "What is 12 * 7?" }, ANSWER_SCHEMA);
    const reason = result.run.stopSignal?.reason;
    expect(reason === StopReason.COMPLETED, `stop reason ${reason}`);
    const calls = result.steps.flatMap((step) => step.toolCalls.map((call) => call.name));
    expect(calls.join(",") === "calculate", `tool calls ${calls.join(",")}`);
    expect(
      JSON.stringify(result.output) === JSON.stringify({ answer: 0 }),
      `output ${JSON.stringify(result.output)}`,
    );
  }

  async approval(): Promise<void> {
    const waiting = (
      await this.client.runToEnd({ input: "What is 12 * 7?", requireApproval: ["calculate"] })
    ).run;
    expect(waiting?.status === RunStatus.REQUIRES_ACTION, `status ${waiting?.status}`);
    const held = (waiting.requiredAction?.approvals ?? []).map((call) => call.name);
    expect(held.join(",") === "calculate", `waiting for ${held.join(",")}`);
    const events: StepEvent[] = [];
    for await (const event of this.client.approve(waiting.id)) events.push(event);
    const done = terminalRun(events[events.length - 1]);
    expect(
      done?.id === waiting.id && done.stopSignal?.reason === StopReason.COMPLETED,
      `stop ${done?.stopSignal?.reason}`,
    );
    const steps = events.flatMap((e) =>
      e.event.case === "stepCompleted" ? [e.event.value.step] : [],
    );
    expect(steps[0]?.approval?.approved === true, "the result keeps no approval");
    expect((steps[steps.length - 1]?.content ?? "").includes("84"), "final text");
  }

  async listSteps(): Promise<void> {
    expect(this.toolRun !== undefined, "no session to list (run_with_tool failed)");
    const sequences: bigint[] = [];
    for await (const step of this.client.listSteps(this.toolRun.sessionId, PAGE_SIZE)) {
      sequences.push(step.sequence);
    }
    const session = await this.client.getSession(this.toolRun.sessionId);
    expect(sequences.length > PAGE_SIZE, `only ${sequences.length} steps: paging not exercised`);
    expect(
      sequences.every((s, i) => s === BigInt(i + 1)) &&
        BigInt(sequences.length) === BigInt(session?.stepCount ?? -1),
      `sequences ${sequences.join(",")}, session step_count ${session?.stepCount}`,
    );
  }
}

async function main(): Promise<number> {
  const { values } = parseArgs({
    options: {
      address: { type: "string" },
      "slow-address": { type: "string" },
      protocol: { type: "string", default: "grpc" },
    },
  });
  const protocol = values.protocol as Protocol;
  if (!values.address || !values["slow-address"] || !PROTOCOLS.includes(protocol)) {
    console.error(
      "usage: scenario.js --address HOST:PORT --slow-address HOST:PORT [--protocol grpc|connect|grpc-web]",
    );
    return 2;
  }
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  const scenario = new Scenario(values.address, values["slow-address"], protocol);
  const checks: [string, () => Promise<void>][] = [
    ["health", () => scenario.health()],
    ["run_with_tool", () => scenario.runWithTool()],
    ["trace_id", () => scenario.traceIdCheck()],
    ["cancel", () => scenario.cancel()],
    ["not_found", () => scenario.notFound()],
    ["list_steps", () => scenario.listSteps()],
    ["background_resume", () => scenario.backgroundResume()],
    ["follow_after_end", () => scenario.followAfterEnd()],
    ["structured_output", () => scenario.structuredOutput()],
    ["approval", () => scenario.approval()],
  ];
  if (protocol === "grpc") {
    // The web transport's TLS is the browser's (or fetch's) business.
    checks.push(["tls_hint", () => scenario.tlsHint()]);
  }
  let failed = 0;
  for (const [name, check] of checks) {
    try {
      await withTimeout(check(), RUN_TIMEOUT_MS + CALL_TIMEOUT_MS);
      console.log(`ok ${name}`);
    } catch (error) {
      failed++;
      const kind = error instanceof Error ? error.name : "Error";
      console.log(`FAIL ${name}: ${kind}: ${error instanceof Error ? error.message : error}`);
    }
  }
  return failed ? 1 : 0;
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    console.error(error);
    process.exit(1);
  },
);
