// The run console: agio-grpc's sessions, their steps as a timeline, their runs, and a chat
// box that streams a run live, in a browser, over Connect on the HTTP listener that serves
// this page (same origin). Built by `npm run console` into agio_grpc/service/console/.
// Plain DOM: every element is made here, text always set as text (never as HTML).
import { createClient, type Client } from "@connectrpc/connect";

import {
  AgentService,
  Role,
  RunStatus,
  SessionService,
  StopReason,
  decodeError,
  webTransport,
  type Run,
  type Session,
  type Step,
  type StepEvent,
} from "../src/web.js";

const SESSION_PAGE = 20;
const TOKEN_KEY = "agio-console-token";

interface ConsoleConfig {
  /** A link to a trace, `{trace_id}` replaced (e.g. a Jaeger trace page); "" for none. */
  traceUrlTemplate: string;
}

type Clients = { agents: Client<typeof AgentService>; sessions: Client<typeof SessionService> };

function element<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attributes: Record<string, string> = {},
  ...children: (Node | string)[]
): HTMLElementTagNameMap[K] {
  const made = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) made.setAttribute(key, value);
  made.append(...children);
  return made;
}

function byId<T extends HTMLElement>(id: string): T {
  const found = document.getElementById(id);
  if (!found) throw new Error(`the page has no #${id}`);
  return found as T;
}

function stopReasonName(reason: StopReason): string {
  return StopReason[reason] ?? String(reason);
}

function roleName(role: Role): string {
  return (Role[role] ?? String(role)).toLowerCase();
}

function when(seconds: bigint | undefined): string {
  return seconds ? new Date(Number(seconds) * 1000).toLocaleString() : "";
}

class Console {
  private clients: Clients;
  private config: ConsoleConfig = { traceUrlTemplate: "" };
  private sessionToken = "";
  private session = "";
  private liveRun = "";
  private abort: AbortController | undefined;

  constructor() {
    this.clients = this.connect(sessionStorage.getItem(TOKEN_KEY) ?? "");
  }

  private connect(token: string): Clients {
    const transport = webTransport(window.location.origin, { token: token || undefined });
    return {
      agents: createClient(AgentService, transport),
      sessions: createClient(SessionService, transport),
    };
  }

  async start(): Promise<void> {
    const loaded = await fetch("console-config.json").then((r) => (r.ok ? r.json() : {}));
    this.config = { ...this.config, ...(loaded as Partial<ConsoleConfig>) };
    byId<HTMLInputElement>("token").value = sessionStorage.getItem(TOKEN_KEY) ?? "";
    byId("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const token = byId<HTMLInputElement>("token").value.trim();
      sessionStorage.setItem(TOKEN_KEY, token);
      this.clients = this.connect(token);
      void this.reloadSessions();
    });
    byId("new-session").addEventListener("click", () => this.open(""));
    byId("more-sessions").addEventListener("click", () => void this.loadSessions(false));
    byId("chat").addEventListener("submit", (event) => {
      event.preventDefault();
      void this.send();
    });
    byId("cancel").addEventListener("click", () => void this.cancel());
    await this.reloadSessions();
  }

  // -- errors ---------------------------------------------------------------------------

  private showError(error: unknown): void {
    const failed = decodeError(error);
    const hint = failed.codeName === "UNAUTHENTICATED" ? " (enter a credential above)" : "";
    byId("error").textContent =
      `${failed.codeName}${failed.reason ? ` ${failed.reason}` : ""}: ${failed.rawMessage}${hint}`;
  }

  private clearError(): void {
    byId("error").textContent = "";
  }

  // -- sessions -------------------------------------------------------------------------

  private async reloadSessions(): Promise<void> {
    byId("sessions").replaceChildren();
    this.sessionToken = "";
    await this.loadSessions(true);
  }

  private async loadSessions(first: boolean): Promise<void> {
    if (!first && !this.sessionToken) return;
    try {
      const page = await this.clients.sessions.listSessions({
        pageSize: SESSION_PAGE,
        pageToken: this.sessionToken,
      });
      this.clearError();
      for (const session of page.sessions) byId("sessions").append(this.sessionItem(session));
      this.sessionToken = page.nextPageToken;
      byId<HTMLButtonElement>("more-sessions").hidden = !page.nextPageToken;
    } catch (error) {
      this.showError(error);
    }
  }

  private sessionItem(session: Session): HTMLElement {
    const button = element(
      "button",
      { type: "button", class: "session", "data-session": session.id },
      element("span", { class: "id" }, session.id),
      element("span", { class: "meta" }, `${session.stepCount} steps · ${when(session.updateTime?.seconds)}`),
    );
    button.addEventListener("click", () => void this.open(session.id));
    return element("li", {}, button);
  }

  private async open(sessionId: string): Promise<void> {
    this.session = sessionId;
    byId("session-title").textContent = sessionId || "New session";
    byId("live").replaceChildren();
    byId("steps").replaceChildren();
    byId("runs").replaceChildren();
    if (sessionId) await this.loadSession();
  }

  private async loadSession(): Promise<void> {
    const sessionId = this.session;
    try {
      const steps: Step[] = [];
      let pageToken = "";
      do {
        const page = await this.clients.sessions.listSteps({ sessionId, pageToken });
        steps.push(...page.steps);
        pageToken = page.nextPageToken;
      } while (pageToken);
      const runs = await this.clients.agents.listRuns({ sessionId });
      if (sessionId !== this.session) return;
      this.clearError();
      byId("steps").replaceChildren(...steps.map((step) => this.stepItem(step)));
      byId("runs").replaceChildren(...runs.runs.map((run) => this.runItem(run)));
    } catch (error) {
      this.showError(error);
    }
  }

  // -- the timeline ---------------------------------------------------------------------

  private stepItem(step: Step): HTMLElement {
    const role = roleName(step.role);
    const item = element(
      "li",
      { class: `step ${role}${step.isError ? " error" : ""}`, "data-sequence": `${step.sequence}` },
      element("div", { class: "head" }, element("span", { class: "seq" }, `#${step.sequence}`), element("span", { class: "role" }, role), step.name ? element("span", { class: "tool" }, step.name) : ""),
    );
    if (step.reasoningContent) {
      item.append(element("div", { class: "reasoning" }, step.reasoningContent));
    }
    if (step.content) item.append(element("div", { class: "content" }, step.content));
    for (const call of step.toolCalls) {
      item.append(
        element("div", { class: "tool-call" }, element("span", { class: "tool" }, call.name), element("code", {}, call.arguments)),
      );
    }
    item.append(this.metrics(step), this.stepActions(step));
    return item;
  }

  private metrics(step: Step): HTMLElement {
    const m = step.metrics;
    const parts: string[] = [];
    if (m?.firstTokenLatencyMs) parts.push(`first token ${m.firstTokenLatencyMs} ms`);
    if (m?.durationMs) parts.push(`${m.durationMs} ms`);
    if (m?.inputTokens || m?.outputTokens) parts.push(`${m.inputTokens} in / ${m.outputTokens} out tokens`);
    if (m?.toolExecTimeMs) parts.push(`tool ${m.toolExecTimeMs} ms`);
    if (m?.modelName) parts.push(m.modelName);
    const line = element("div", { class: "metrics" }, parts.join(" · "));
    if (step.traceId) {
      const template = this.config.traceUrlTemplate;
      const text = `trace ${step.traceId}`;
      line.append(
        " · ",
        template
          ? element("a", { href: template.replace("{trace_id}", step.traceId), target: "_blank", rel: "noopener" }, text)
          : element("span", { class: "trace" }, text),
      );
    }
    return line;
  }

  private stepActions(step: Step): HTMLElement {
    const fork = element("button", { type: "button", class: "fork" }, "Fork here");
    fork.addEventListener("click", () => void this.fork(step.sequence));
    const actions = element("div", { class: "actions" }, fork);
    if (step.role === Role.USER || step.role === Role.ASSISTANT) {
      const retry = element("button", { type: "button", class: "retry" }, "Retry from here");
      retry.addEventListener("click", () => void this.retry(step.sequence));
      actions.append(retry);
    }
    return actions;
  }

  private runItem(run: Run): HTMLElement {
    const reason = run.stopSignal ? stopReasonName(run.stopSignal.reason) : "";
    return element(
      "li",
      { class: "run", "data-run": run.id },
      element("span", { class: "id" }, run.id),
      element("span", { class: "status" }, RunStatus[run.status] ?? String(run.status)),
      element("span", { class: "reason" }, reason),
      element("span", { class: "meta" }, when(run.createTime?.seconds)),
    );
  }

  // -- runs -----------------------------------------------------------------------------

  private async send(): Promise<void> {
    const input = byId<HTMLTextAreaElement>("input");
    const text = input.value.trim();
    if (!text || this.abort) return;
    input.value = "";
    await this.stream((signal) =>
      this.clients.agents.run({ sessionId: this.session, input: text }, { signal }),
    );
  }

  private async retry(sequence: bigint): Promise<void> {
    if (this.abort) return;
    const sessionId = this.session;
    await this.stream((signal) => this.clients.agents.retry({ sessionId, sequence }, { signal }));
  }

  private async fork(sequence: bigint): Promise<void> {
    try {
      const forked = await this.clients.sessions.forkSession({ sessionId: this.session, sequence });
      await this.reloadSessions();
      if (forked.session) await this.open(forked.session.id);
    } catch (error) {
      this.showError(error);
    }
  }

  private async cancel(): Promise<void> {
    if (!this.liveRun) return;
    try {
      await this.clients.agents.cancelRun({ runId: this.liveRun, reason: "cancelled in the console" });
    } catch (error) {
      this.showError(error);
    }
  }

  /** Shows a run's events as they arrive: text, tool calls, tool results, the stop reason. */
  private async stream(call: (signal: AbortSignal) => AsyncIterable<StepEvent>): Promise<void> {
    this.abort = new AbortController();
    const live = byId("live");
    live.replaceChildren();
    const status = element("div", { class: "status" }, "running…");
    live.append(status);
    let text: HTMLElement | undefined;
    byId<HTMLButtonElement>("cancel").disabled = false;
    this.clearError();
    try {
      for await (const event of call(this.abort.signal)) {
        const { case: kind, value } = event.event;
        if (kind === "runStarted") {
          this.liveRun = event.runId;
          if (!this.session) {
            this.session = event.sessionId;
            byId("session-title").textContent = event.sessionId;
          }
          live.dataset.run = event.runId;
        } else if (kind === "stepStarted") {
          text = undefined;
        } else if (kind === "stepDelta") {
          if (value.content) {
            if (!text) {
              text = element("div", { class: "content streaming" });
              live.insertBefore(text, status);
            }
            text.textContent += value.content;
          }
          for (const fragment of value.toolCalls) {
            if (fragment.name) {
              live.insertBefore(element("div", { class: "tool-call started" }, `calling ${fragment.name}`), status);
            }
          }
        } else if (kind === "stepCompleted" && value.step?.role === Role.TOOL) {
          const step = value.step;
          live.insertBefore(
            element("div", { class: `tool-result${step.isError ? " error" : ""}` }, `${step.name} → ${step.content}`),
            status,
          );
        } else if (kind === "runCompleted" || kind === "runFailed") {
          const signal = value.run?.stopSignal;
          status.textContent = signal
            ? `${stopReasonName(signal.reason)}${signal.message ? `: ${signal.message}` : ""}`
            : "ended";
          status.classList.add("ended");
        } else if (kind === "error") {
          live.insertBefore(element("div", { class: "event-error" }, value.message), status);
        }
      }
    } catch (error) {
      status.textContent = "failed";
      this.showError(error);
    } finally {
      this.abort = undefined;
      this.liveRun = "";
      byId<HTMLButtonElement>("cancel").disabled = true;
    }
    await this.reloadSessions();
    if (this.session) await this.loadSession();
  }
}

void new Console().start();
