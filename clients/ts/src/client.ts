// A thin typed client for agio-grpc over the gRPC protocol (Node.js, HTTP/2).
import { readFileSync } from "node:fs";
import type { SecureClientSessionOptions } from "node:http2";

import {
  create,
  toJson,
  type JsonObject,
  type JsonValue,
  type MessageInitShape,
} from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import {
  Code,
  createClient,
  type Client,
  type Interceptor,
  type Transport,
} from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

import {
  AgentService,
  RunRequestSchema,
  type ToolApprovalSchema,
  type ToolOutputSchema,
} from "./gen/agio/v1/agent_service_pb.js";
import type { StepEvent } from "./gen/agio/v1/events_pb.js";
import {
  Role,
  type Agent,
  type Run,
  type Session,
  type Step,
} from "./gen/agio/v1/resources_pb.js";
import {
  SessionService,
  type CompactSessionResponse,
  type GetContextResponse,
} from "./gen/agio/v1/session_service_pb.js";
import { Health, HealthCheckResponse_ServingStatus } from "./gen/grpc/health/v1/health_pb.js";
import { bearerToken } from "./auth.js";
import { addresses, dnsTarget, resolvedRoundRobin, roundRobin } from "./balancing.js";
import { AgioError, decodeError } from "./errors.js";
import { withTlsFailure } from "./tls_failure.js";
import { traceContextInterceptor } from "./tracing.js";

/** How the client reaches the server over TLS. */
export interface TlsConfig {
  /** PEM certificates of the CAs that signed the server's certificate; unset: Node's roots. */
  caFile?: string;
  /** The client's PEM certificate chain, for a server that asks for one (mutual TLS). */
  certFile?: string;
  /** The PEM private key of `certFile`. */
  keyFile?: string;
}

export interface AgioClientOptions {
  /** Sent as `authorization: Bearer <token>` with every call (over TLS or plaintext). */
  token?: string;
  /** TLS: `true` trusts Node's roots, a `TlsConfig` names the files; a target `https://…` is
   * TLS with Node's roots too. */
  tls?: TlsConfig | boolean;
  /** Extra connect interceptors, called after the trace-context and token ones. */
  interceptors?: Interceptor[];
  /** Headers (gRPC metadata) sent with every call. */
  headers?: Record<string, string>;
  /** Deadline of unary calls in milliseconds (default 30 s; runs set their own). */
  timeoutMs?: number;
}

/** Options of one run call. */
export interface CallOptions {
  /** Aborting it cancels the call, and with it the run on the server. */
  signal?: AbortSignal;
  timeoutMs?: number;
  headers?: Record<string, string>;
}

/** What a whole run produced, collected by `AgioClient.runToEnd`. */
export interface RunResult {
  /** The final run from the terminal event, with its stop signal and usage. */
  run: Run;
  /** The content of the last assistant step that had any. */
  text: string;
  /** The stored steps the run produced, in order. */
  steps: Step[];
  events: number;
  /**
   * A run with an output schema that completed: its answer as a JSON value; undefined when the
   * run ended without one (STOP_REASON_OUTPUT_INVALID, a limit: its stop signal says why).
   */
  output?: JsonValue;
}

/** A run's structured answer (`Run.output`) as a JSON value; undefined when it has none. */
export function runOutput(run: Run): JsonValue | undefined {
  return run.output === undefined ? undefined : toJson(ValueSchema, run.output);
}

/**
 * `RunRequest.outputSchemaJson` for `schema`: a string is taken as JSON text as it is, any
 * other value (a JSON Schema object) is encoded.
 */
export function outputSchemaJson(schema: string | JsonObject): string {
  return typeof schema === "string" ? schema : JSON.stringify(schema);
}

/** The final run of a `runCompleted` or `runFailed` event, else undefined. */
export function terminalRun(event: StepEvent): Run | undefined {
  const { case: kind, value } = event.event;
  return kind === "runCompleted" || kind === "runFailed" ? value.run : undefined;
}

function baseUrl(target: string, tls: TlsConfig | boolean): string {
  if (!target.includes("://")) {
    return `${tls ? "https" : "http"}://${target}`;
  }
  if (tls && !target.startsWith("https://")) {
    throw new Error(`TLS options need a host:port or https:// target, not ${target}`);
  }
  return target;
}

function secureSessionOptions(tls: TlsConfig): SecureClientSessionOptions {
  if (!tls.certFile !== !tls.keyFile) {
    throw new Error("a client certificate goes with its key: give both or neither");
  }
  const read = (path: string | undefined, what: string): Buffer | undefined => {
    if (!path) return undefined;
    try {
      return readFileSync(path);
    } catch (error) {
      const reason = (error as NodeJS.ErrnoException).code ?? String(error);
      throw new Error(`cannot read the ${what} file ${path}: ${reason}`);
    }
  };
  return {
    ca: read(tls.caFile, "CA"),
    cert: read(tls.certFile, "certificate"),
    key: read(tls.keyFile, "key"),
  };
}


/** Whether the gRPC transport to `target` speaks TLS (`baseUrl` decides it the same way). */
function speaksTls(target: string | readonly string[], options: AgioClientOptions): boolean {
  const https = addresses(target).every((address) => address.startsWith("https://"));
  return Boolean(options.tls) || https;
}

function isTransport(target: string | readonly string[] | Transport): target is Transport {
  return typeof target === "object" && "unary" in target && "stream" in target;
}

/** gRPC over HTTP/2 (connect-node) to the servers `target` names, round robin. */
function grpcTransport(target: string | readonly string[], options: AgioClientOptions): Transport {
  const token = options.token ? [bearerToken(options.token)] : [];
  const tls = options.tls ?? false;
  const nodeOptions = typeof tls === "object" ? secureSessionOptions(tls) : {};
  const interceptors = [traceContextInterceptor, ...token, ...(options.interceptors ?? [])];
  const connect = (address: string, servername?: string) =>
    createGrpcTransport({
      baseUrl: baseUrl(address, tls),
      nodeOptions: servername && tls ? { ...nodeOptions, servername } : nodeOptions,
      interceptors,
    });
  return roundRobin(
    addresses(target).map((address) => {
      const name = dnsTarget(address);
      if (!name) return connect(address);
      // Certificates are checked against the name, not the address it resolved to.
      return resolvedRoundRobin(name.host, name.port, (ip) => connect(ip, name.host));
    }),
  );
}

/** HTTP/2 connections to agio-grpc servers (one per server) and typed calls on them. */
export class AgioClient {
  /** The raw AgentService client. */
  readonly agents: Client<typeof AgentService>;
  /** The raw SessionService client. */
  readonly sessions: Client<typeof SessionService>;
  private readonly health: Client<typeof Health>;
  private readonly headers: Record<string, string>;
  private readonly timeoutMs: number;
  /** Whether the gRPC transport speaks TLS; undefined for a transport the caller made. */
  private readonly tls: boolean | undefined;

  /**
   * `target` is `host:port` (plaintext unless `options.tls`, as the Go and Python clients
   * take it) or a URL: `http://host:port`, `https://…`; several of them (a list, or one
   * string separated by commas, as AGIO_ADDRESS holds them), or `dns:///host:port` (every
   * address the name resolves to), which the calls go to round robin (src/balancing.ts).
   * Or a ready `Transport`: `webTransport("http://127.0.0.1:8080")` (src/web.ts) reaches
   * the HTTP listener over Connect or gRPC-Web; `token`, `tls` and `interceptors` are then
   * the transport's business. Throws when a TLS file cannot be read.
   */
  constructor(target: string | readonly string[] | Transport, options: AgioClientOptions = {}) {
    const transport = isTransport(target) ? target : grpcTransport(target, options);
    this.tls = isTransport(target) ? undefined : speaksTls(target, options);
    this.agents = createClient(AgentService, transport);
    this.sessions = createClient(SessionService, transport);
    this.health = createClient(Health, transport);
    this.headers = options.headers ?? {};
    this.timeoutMs = options.timeoutMs ?? 30_000;
  }

  /** Starts a run and yields its events; the last is `runCompleted` or `runFailed`. */
  run(
    request: MessageInitShape<typeof RunRequestSchema>,
    options: CallOptions = {},
  ): AsyncGenerator<StepEvent, void, undefined> {
    return this.events((call) => this.agents.run(create(RunRequestSchema, request), call), options);
  }

  /** Continues a REQUIRES_ACTION run with the client tools' outputs. */
  submitToolOutputs(
    runId: string,
    toolOutputs: MessageInitShape<typeof ToolOutputSchema>[],
    options: CallOptions = {},
  ): AsyncGenerator<StepEvent, void, undefined> {
    return this.events(
      (call) => this.agents.submitToolOutputs({ runId, toolOutputs }, call),
      options,
    );
  }

  /**
   * Continues a REQUIRES_ACTION run with everything its `requiredAction` waits for at once:
   * an output per client tool call and a decision per call waiting for approval (anything
   * left out is INVALID_ARGUMENT, naming the ids, and changes nothing).
   */
  submitAnswers(
    runId: string,
    toolOutputs: MessageInitShape<typeof ToolOutputSchema>[],
    approvals: MessageInitShape<typeof ToolApprovalSchema>[],
    options: CallOptions = {},
  ): AsyncGenerator<StepEvent, void, undefined> {
    return this.events(
      (call) => this.agents.submitToolOutputs({ runId, toolOutputs, approvals }, call),
      options,
    );
  }

  /**
   * Approves calls of a run waiting for approval (every call it waits for when `callIds` is
   * empty) and yields the continued run's events.
   */
  approve(
    runId: string,
    callIds: string[] = [],
    reason = "",
    options: CallOptions = {},
  ): AsyncGenerator<StepEvent, void, undefined> {
    return this.decide(runId, callIds, true, reason, options);
  }

  /**
   * Rejects calls of a run waiting for approval (every one when `callIds` is empty): the model
   * sees each was rejected, and `reason`. Yields the continued run's events.
   */
  reject(
    runId: string,
    callIds: string[] = [],
    reason = "",
    options: CallOptions = {},
  ): AsyncGenerator<StepEvent, void, undefined> {
    return this.decide(runId, callIds, false, reason, options);
  }

  private async *decide(
    runId: string,
    callIds: string[],
    approved: boolean,
    reason: string,
    options: CallOptions,
  ): AsyncGenerator<StepEvent, void, undefined> {
    const ids = callIds.length
      ? callIds
      : ((await this.getRun(runId))?.requiredAction?.approvals ?? []).map((call) => call.id);
    const approvals = ids.map((toolCallId) => ({ toolCallId, approved, reason }));
    yield* this.submitAnswers(runId, [], approvals, options);
  }

  /** Deletes a session's steps from `sequence` on and regenerates. */
  retry(
    sessionId: string,
    sequence: bigint,
    options: CallOptions = {},
  ): AsyncGenerator<StepEvent, void, undefined> {
    return this.events((call) => this.agents.retry({ sessionId, sequence }, call), options);
  }

  /** Replays a run's events after `afterSeq`, then follows it live. */
  watchRun(
    runId: string,
    afterSeq = 0n,
    options: CallOptions = {},
  ): AsyncGenerator<StepEvent, void, undefined> {
    return this.events((call) => this.agents.watchRun({ runId, afterSeq }, call), options);
  }

  /**
   * Starts a run in the background and returns it at once (RUNNING, or QUEUED behind a busy
   * session, by `onBusy`); follow it with `followRun`, stop it with `cancelRun`.
   */
  async startRun(request: MessageInitShape<typeof RunRequestSchema>): Promise<Run | undefined> {
    const response = await this.unary(() => this.agents.startRun(request, this.callOptions()));
    return response.run;
  }

  /**
   * A run's events after `afterSeq` to its terminal event, replayed then live. When the stream
   * breaks with UNAVAILABLE (a server restarting) it watches again from the last seq it
   * yielded, up to `reconnects` times in a row, backing off from 200 ms. With `afterSeq` at the
   * terminal event's seq the server's stream is empty (status OK): this ends at once, yielding
   * nothing.
   */
  async *followRun(
    runId: string,
    afterSeq = 0n,
    reconnects = 10,
  ): AsyncGenerator<StepEvent, void, undefined> {
    let cursor = afterSeq;
    let failures = 0;
    for (;;) {
      try {
        for await (const event of this.watchRun(runId, cursor)) {
          yield event;
          cursor = event.seq;
          failures = 0;
          if (terminalRun(event) !== undefined) return;
        }
        return;
      } catch (error) {
        if (!(error instanceof AgioError) || error.code !== Code.Unavailable) throw error;
        if (failures >= reconnects) throw error;
      }
      await new Promise((resolve) => setTimeout(resolve, Math.min(200 * 2 ** failures, 5000)));
      failures++;
    }
  }

  /** Runs and collects: the final run, the last assistant text and the stored steps. */
  async runToEnd(
    request: MessageInitShape<typeof RunRequestSchema>,
    options: CallOptions = {},
  ): Promise<RunResult> {
    const steps: Step[] = [];
    let events = 0;
    for await (const event of this.run(request, options)) {
      events++;
      if (event.event.case === "stepCompleted" && event.event.value.step) {
        steps.push(event.event.value.step);
      }
      const run = terminalRun(event);
      if (run) {
        const assistant = steps.filter((s) => s.role === Role.ASSISTANT && s.content);
        const output = runOutput(run);
        return { run, text: assistant.at(-1)?.content ?? "", steps, events, output };
      }
    }
    throw new AgioError(2, "the run stream ended without a terminal event");
  }

  /**
   * `runToEnd` with `schema` as the run's output schema (it replaces the agent's): the result's
   * `output` is the run's answer as a JSON value.
   */
  async runForOutput(
    request: MessageInitShape<typeof RunRequestSchema>,
    schema: string | JsonObject,
    options: CallOptions = {},
  ): Promise<RunResult> {
    return this.runToEnd({ ...request, outputSchemaJson: outputSchemaJson(schema) }, options);
  }

  /** Asks the server to stop a run; its stream then ends with CANCELLED. */
  async cancelRun(runId: string, reason = ""): Promise<Run | undefined> {
    return (await this.unary(() => this.agents.cancelRun({ runId, reason }, this.callOptions()))).run;
  }

  async getRun(runId: string): Promise<Run | undefined> {
    return (await this.unary(() => this.agents.getRun({ runId }, this.callOptions()))).run;
  }

  /** A session's runs, newest first, fetched `pageSize` at a time to the last page. */
  listRuns(sessionId: string, pageSize = 0): AsyncGenerator<Run, void, undefined> {
    return this.pages(async (pageToken) => {
      const page = await this.agents.listRuns(
        { sessionId, pageSize, pageToken },
        this.callOptions(),
      );
      return [page.runs, page.nextPageToken];
    });
  }

  async listAgents(): Promise<Agent[]> {
    return (await this.unary(() => this.agents.listAgents({}, this.callOptions()))).agents;
  }

  async getSession(sessionId: string): Promise<Session | undefined> {
    return (await this.unary(() => this.sessions.getSession({ sessionId }, this.callOptions())))
      .session;
  }

  /** Every session, newest first, fetched `pageSize` at a time to the last page. */
  listSessions(pageSize = 0): AsyncGenerator<Session, void, undefined> {
    return this.pages(async (pageToken) => {
      const page = await this.sessions.listSessions({ pageSize, pageToken }, this.callOptions());
      return [page.sessions, page.nextPageToken];
    });
  }

  /** Deletes a session and its steps; resolves to the number of steps deleted. */
  async deleteSession(sessionId: string): Promise<bigint> {
    return (
      await this.unary(() => this.sessions.deleteSession({ sessionId }, this.callOptions()))
    ).deletedSteps;
  }

  /** A session's steps in sequence order, fetched `pageSize` at a time to the last page. */
  listSteps(sessionId: string, pageSize = 0): AsyncGenerator<Step, void, undefined> {
    return this.pages(async (pageToken) => {
      const page = await this.sessions.listSteps(
        { sessionId, pageSize, pageToken },
        this.callOptions(),
      );
      return [page.steps, page.nextPageToken];
    });
  }

  async getStep(sessionId: string, sequence: bigint): Promise<Step | undefined> {
    return (
      await this.unary(() => this.sessions.getStep({ sessionId, sequence }, this.callOptions()))
    ).step;
  }

  /** Deletes a session's steps from `startSequence` on; resolves to how many went. */
  async deleteSteps(sessionId: string, startSequence: bigint): Promise<bigint> {
    return (
      await this.unary(() =>
        this.sessions.deleteSteps({ sessionId, startSequence }, this.callOptions()),
      )
    ).deletedCount;
  }

  /** Copies a session's steps up to `sequence` (0: all) into a new session. */
  async forkSession(sessionId: string, sequence = 0n): Promise<Session | undefined> {
    return (
      await this.unary(() =>
        this.sessions.forkSession({ sessionId, sequence }, this.callOptions()),
      )
    ).session;
  }

  /**
   * Summarizes a session's older steps now, keeping `keepRecentSteps` after the summary (0:
   * the agent's setting); refused while a run holds the session. The response's `summary` is
   * unset when nothing was old enough to summarize.
   */
  async compactSession(
    sessionId: string,
    keepRecentSteps = 0,
    agent = "",
  ): Promise<CompactSessionResponse> {
    return await this.unary(() =>
      this.sessions.compactSession({ sessionId, keepRecentSteps, agent }, this.callOptions()),
    );
  }

  /**
   * The messages the model would receive next, and their summary: every page, joined (a page
   * token is refused once the session changed: INVALID_ARGUMENT).
   */
  async getContext(sessionId: string, agent = ""): Promise<GetContextResponse> {
    let pageToken = "";
    let whole: GetContextResponse | undefined;
    for (;;) {
      const page = await this.unary(() =>
        this.sessions.getContext({ sessionId, agent, pageToken }, this.callOptions()),
      );
      if (whole === undefined) {
        whole = page;
      } else {
        whole.messages.push(...page.messages);
        whole.summary = page.summary;
      }
      pageToken = page.nextPageToken;
      if (!pageToken) {
        whole.nextPageToken = "";
        return whole;
      }
    }
  }

  /** The serving status name, e.g. `SERVING`. */
  async checkHealth(service = ""): Promise<string> {
    const response = await this.unary(() => this.health.check({ service }, this.callOptions()));
    return HealthCheckResponse_ServingStatus[response.status];
  }

  private async *events(
    start: (call: CallOptions) => AsyncIterable<StepEvent>,
    options: CallOptions,
  ): AsyncGenerator<StepEvent, void, undefined> {
    const call = { ...options, headers: { ...this.headers, ...options.headers } };
    try {
      yield* start(call);
    } catch (error) {
      throw this.decode(error);
    }
  }

  private async *pages<T>(
    fetch: (pageToken: string) => Promise<[T[], string]>,
  ): AsyncGenerator<T, void, undefined> {
    let pageToken = "";
    do {
      const [items, next] = await this.unary(() => fetch(pageToken));
      yield* items;
      pageToken = next;
    } while (pageToken);
  }

  private callOptions() {
    return { headers: this.headers, timeoutMs: this.timeoutMs };
  }

  private async unary<T>(call: () => Promise<T>): Promise<T> {
    try {
      return await call();
    } catch (error) {
      throw this.decode(error);
    }
  }

  /** The AgioError of a failed call; an AgioTlsError when its connection failed in TLS. */
  private decode(error: unknown): AgioError {
    const decoded = decodeError(error);
    return this.tls === undefined ? decoded : withTlsFailure(decoded, this.tls);
  }
}
