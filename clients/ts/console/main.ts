// The run console: agio-grpc's sessions, their steps as a timeline, their runs, and a chat
// box that streams a run live, in a browser, over Connect on the HTTP listener that serves
// this page (same origin). Built by `npm run console` into agio_grpc/service/console/.
// Plain DOM: every element is made here, text always set as text (never as HTML), no inline
// style (the page's Content-Security-Policy allows its own stylesheet only).
import { toJson } from "@bufbuild/protobuf";
import { ValueSchema } from "@bufbuild/protobuf/wkt";
import { createClient, type Client } from "@connectrpc/connect";

import {
  AgentService,
  Role,
  RunStatus,
  SessionService,
  StopReason,
  decodeError,
  webTransport,
  type Agent,
  type Run,
  type Session,
  type Step,
  type StepEvent,
} from "../src/web.js";
import { forkOffer, retryBlocker, retryOffer, type Offer } from "./edits.js";

const SESSION_PAGE = 20;
const TOKEN_KEY = "agio-console-token";

interface ConsoleConfig {
  /** A link to a trace, `{trace_id}` replaced (e.g. a Jaeger trace page); "" for none. */
  traceUrlTemplate: string;
}

type Clients = { agents: Client<typeof AgentService>; sessions: Client<typeof SessionService> };

/** Output of a step a run streamed but never stored (the run was cancelled, timed out or
 * failed before the step ended): kept on the timeline, after the step it followed, for as
 * long as the page is open and that step is still there. */
interface Unfinished {
  /** The stored step it followed: its id once known, else its sequence (0: the last one). */
  afterStepId: string;
  afterSequence: bigint;
  content: string;
  toolCalls: string[];
  /** How the run ended, e.g. "cancelled". */
  mark: string;
}

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

/** A run's structured answer (`Run.output`) as indented JSON; undefined when it has none. */
function outputJson(run: Run): string | undefined {
  return run.output === undefined ? undefined : JSON.stringify(toJson(ValueSchema, run.output), null, 2);
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

/** A button for an edit the server may refuse: disabled with the reason as its tooltip. */
function offerButton(className: string, label: string, offer: Offer, act: () => void): HTMLButtonElement {
  const button = element("button", { type: "button", class: className }, label);
  if (offer.accepted) {
    button.title = offer.says;
    button.addEventListener("click", act);
  } else {
    button.disabled = true;
    button.title = offer.why;
  }
  return button;
}

class Console {
  private clients: Clients;
  private config: ConsoleConfig = { traceUrlTemplate: "" };
  private sessionToken = "";
  private session = "";
  private steps: Step[] = [];
  private runs: Run[] = [];
  private unfinished = new Map<string, Unfinished[]>();
  private liveRun = "";
  private abort: AbortController | undefined;
  private pending = 0;

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
    byId<HTMLInputElement>("token").value = sessionStorage.getItem(TOKEN_KEY) ?? "";
    byId("token-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const token = byId<HTMLInputElement>("token").value.trim();
      sessionStorage.setItem(TOKEN_KEY, token);
      this.clients = this.connect(token);
      void this.act(() => this.loadEverything());
    });
    byId("new-session").addEventListener("click", () => void this.act(() => this.open("")));
    byId("more-sessions").addEventListener("click", () => void this.act(() => this.loadSessions(false)));
    byId("chat").addEventListener("submit", (event) => {
      event.preventDefault();
      void this.act(() => this.send());
    });
    byId("cancel").addEventListener("click", () => void this.act(() => this.cancel()));
    await this.act(async () => {
      const loaded = await fetch("console-config.json").then((r) => (r.ok ? r.json() : {}));
      this.config = { ...this.config, ...(loaded as Partial<ConsoleConfig>) };
      await this.loadEverything();
    });
  }

  /**
   * Does one thing the person asked for. An error on the page answers the previous action,
   * so it goes now, and not before: the reloads that follow a failed call must not wipe
   * its reason. `<main aria-busy>` is true until the action and its reloads are done.
   */
  private async act(action: () => Promise<void>): Promise<void> {
    this.clearError();
    const main = document.querySelector("main");
    this.pending++;
    main?.setAttribute("aria-busy", "true");
    try {
      await action();
    } finally {
      if (--this.pending === 0) main?.setAttribute("aria-busy", "false");
    }
  }

  private async loadEverything(): Promise<void> {
    await Promise.all([this.loadAgents(), this.reloadSessions()]);
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

  // -- agents ---------------------------------------------------------------------------

  private async loadAgents(): Promise<void> {
    try {
      const { agents } = await this.clients.agents.listAgents({});
      byId<HTMLSelectElement>("agent").replaceChildren(...agents.map((agent) => this.agentOption(agent)));
    } catch (error) {
      this.showError(error);
    }
  }

  private agentOption(agent: Agent): HTMLOptionElement {
    const tools = agent.tools.map((tool) => (tool.unavailable ? `${tool.name} (unavailable)` : tool.name));
    return element(
      "option",
      { value: agent.name, title: `${agent.model} · tools: ${tools.join(", ") || "none"}` },
      agent.name,
    );
  }

  /** The picker follows the session: its newest run's agent (a new session: the default). */
  private pickAgent(name: string): void {
    const picker = byId<HTMLSelectElement>("agent");
    const known = Array.from(picker.options).some((option) => option.value === name);
    if (known) picker.value = name;
    else if (picker.options.length) picker.selectedIndex = 0;
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
      for (const session of page.sessions) byId("sessions").append(this.sessionItem(session));
      this.sessionToken = page.nextPageToken;
      byId<HTMLButtonElement>("more-sessions").hidden = !page.nextPageToken;
    } catch (error) {
      this.showError(error);
    }
  }

  private sessionItem(session: Session): HTMLElement {
    const title = session.firstUserMessage || (session.stepCount ? "(no user message first)" : "(empty)");
    const button = element(
      "button",
      { type: "button", class: "session", "data-session": session.id, title: session.firstUserMessage },
      element("span", { class: "title" }, title),
      element("span", { class: "id" }, session.id),
      element("span", { class: "meta" }, `${session.stepCount} steps · ${when(session.updateTime?.seconds)}`),
    );
    button.addEventListener("click", () => void this.act(() => this.open(session.id)));
    return element("li", {}, button);
  }

  private async open(sessionId: string): Promise<void> {
    this.session = sessionId;
    this.steps = [];
    this.runs = [];
    byId("session-title").textContent = sessionId || "New session";
    byId("live").replaceChildren();
    byId("steps").replaceChildren();
    byId("runs").replaceChildren();
    if (sessionId) await this.loadSession();
    else this.pickAgent("");
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
      this.steps = steps;
      this.runs = runs.runs;
      byId("steps").replaceChildren(...this.timeline(sessionId), ...this.approvalPanel(this.runs[0]));
      byId("runs").replaceChildren(...this.runs.flatMap((run) => this.runItems(run)));
      this.pickAgent(this.runs[0]?.agent ?? "");
    } catch (error) {
      this.showError(error);
    }
  }

  // -- the timeline ---------------------------------------------------------------------

  /** The stored steps, each followed by the unfinished output that came after it. */
  private timeline(sessionId: string): HTMLElement[] {
    const kept = this.placeUnfinished(sessionId);
    const items: HTMLElement[] = [];
    this.steps.forEach((step, index) => {
      items.push(this.stepItem(step, index));
      for (const output of kept.filter((u) => u.afterStepId === step.id)) items.push(this.unfinishedItem(output));
    });
    return items;
  }

  /** Ties each unfinished output to the step it followed, by id (a sequence is reused once
   * a retry deletes the step); drops those whose step is gone. */
  private placeUnfinished(sessionId: string): Unfinished[] {
    const last = this.steps[this.steps.length - 1];
    const kept = (this.unfinished.get(sessionId) ?? []).filter((output) => {
      if (!output.afterStepId) {
        const after = output.afterSequence ? this.steps.find((s) => s.sequence === output.afterSequence) : last;
        output.afterStepId = after?.id ?? "";
      }
      return this.steps.some((step) => step.id === output.afterStepId);
    });
    this.unfinished.set(sessionId, kept);
    return kept;
  }

  private stepItem(step: Step, index: number): HTMLElement {
    const role = roleName(step.role);
    const item = element(
      "li",
      { class: `step ${role}${step.isError ? " error" : ""}`, "data-sequence": `${step.sequence}` },
      element(
        "div",
        { class: "head" },
        element("span", { class: "seq" }, `#${step.sequence}`),
        element("span", { class: "role" }, role),
        step.name ? element("span", { class: "tool" }, step.name) : "",
      ),
    );
    if (step.reasoningContent) {
      item.append(element("div", { class: "reasoning" }, step.reasoningContent));
    }
    if (step.content) item.append(element("div", { class: "content" }, step.content));
    if (step.approval) {
      const { approved, decidedBy, reason, decideTime } = step.approval;
      const verdict = `${approved ? "approved" : "rejected"} by ${decidedBy || "-"} ${when(decideTime?.seconds)}`;
      item.append(element("div", { class: "decision" }, reason ? `${verdict}: ${reason}` : verdict));
    }
    for (const call of step.toolCalls) {
      item.append(
        element("div", { class: "tool-call" }, element("span", { class: "tool" }, call.name), element("code", {}, call.arguments)),
      );
    }
    item.append(this.metrics(step), this.stepActions(item, index));
    return item;
  }

  /**
   * The calls the session's newest run waits to have decided, each with Approve and Reject
   * and a reason. A submit must decide them all at once: each choice is kept until the last
   * call has one, then they go together. A run that also waits for client tool outputs is
   * the client's to answer: only shown.
   */
  private approvalPanel(run: Run | undefined): HTMLElement[] {
    const action = run?.status === RunStatus.REQUIRES_ACTION ? run.requiredAction : undefined;
    if (!run || !action?.approvals.length) return [];
    const panel = element(
      "li",
      { class: "approvals", role: "group", "aria-label": "Calls waiting for approval" },
      element("p", { class: "title" }, `Run ${run.id} waits for a decision`),
    );
    const byClient = action.toolCalls.length > 0;
    if (byClient) {
      panel.append(element("p", { class: "note" }, "It also waits for client tool outputs: its client decides."));
    }
    const chosen = new Map<string, { approved: boolean; reason: string }>();
    for (const call of action.approvals) {
      const reason = element("input", {
        type: "text",
        class: "reason",
        placeholder: "reason (the model sees it on a rejection)",
        "aria-label": `Reason for ${call.name}`,
      });
      const choice = element("span", { class: "choice" });
      const decide = (approved: boolean): void => {
        chosen.set(call.id, { approved, reason: reason.value.trim() });
        choice.textContent = approved ? "approved" : "rejected";
        if (chosen.size === action.approvals.length) void this.act(() => this.decide(run.id, chosen));
      };
      const approve = element("button", { type: "button", class: "approve" }, "Approve");
      const reject = element("button", { type: "button", class: "reject" }, "Reject");
      approve.addEventListener("click", () => decide(true));
      reject.addEventListener("click", () => decide(false));
      approve.disabled = reject.disabled = byClient;
      panel.append(
        element(
          "div",
          { class: "pending", "data-call": call.id },
          element("span", { class: "tool" }, call.name),
          element("code", {}, call.arguments),
          reason,
          approve,
          reject,
          choice,
        ),
      );
    }
    return [panel];
  }

  private async decide(runId: string, chosen: Map<string, { approved: boolean; reason: string }>): Promise<void> {
    if (this.abort) return;
    const approvals = Array.from(chosen, ([toolCallId, { approved, reason }]) => ({ toolCallId, approved, reason }));
    const said = approvals.map((a) => `${a.approved ? "approved" : "rejected"} ${a.toolCallId}`).join(", ");
    await this.stream(element("div", { class: "sent decision" }, said), (signal) =>
      this.clients.agents.submitToolOutputs({ runId, approvals }, { signal }),
    );
  }

  private unfinishedItem(output: Unfinished): HTMLElement {
    const item = element(
      "li",
      { class: "step assistant unfinished" },
      element(
        "div",
        { class: "head" },
        element("span", { class: "role" }, "assistant"),
        element("span", { class: "mark" }, output.mark),
        element("span", { class: "note" }, "not stored: the run ended before this step did"),
      ),
    );
    if (output.content) item.append(element("div", { class: "content" }, output.content));
    for (const name of output.toolCalls) item.append(element("div", { class: "tool-call" }, `calling ${name}`));
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

  private stepActions(item: HTMLElement, index: number): HTMLElement {
    const sequence = this.steps[index].sequence;
    const fork = offerButton("fork", "Fork here", forkOffer(this.steps, index), () => {
      void this.act(() => this.fork(sequence));
    });
    const blocker = retryBlocker(this.runs);
    const retry: Offer = blocker
      ? { accepted: false, why: blocker }
      : retryOffer(this.steps, index, (step) => this.agentOf(step));
    const actions = element("div", { class: "actions" }, fork);
    actions.append(
      offerButton("retry", "Retry from here", retry, () => {
        if (retry.accepted) this.confirmRetry(item, sequence, retry.says);
      }),
    );
    return actions;
  }

  private agentOf(step: Step): string {
    return this.runs.find((run) => run.id === step.runId)?.agent ?? "";
  }

  /** A retry deletes steps: it says which, and what runs then, and waits for a yes. */
  private confirmRetry(item: HTMLElement, sequence: bigint, says: string): void {
    for (const open of document.querySelectorAll("#steps .confirm")) open.remove();
    const go = element("button", { type: "button", class: "confirm-retry" }, "Delete and retry");
    const keep = element("button", { type: "button", class: "confirm-keep" }, "Keep the steps");
    const confirm = element(
      "div",
      { class: "confirm", role: "group", "aria-label": `Retry from #${sequence}` },
      element("p", {}, says),
      go,
      keep,
    );
    go.addEventListener("click", () => {
      confirm.remove();
      void this.act(() => this.retry(sequence));
    });
    keep.addEventListener("click", () => confirm.remove());
    item.append(confirm);
    go.focus();
  }

  /** A run's row, and when it has a structured answer, a row showing it as JSON. */
  private runItems(run: Run): HTMLElement[] {
    const output = outputJson(run);
    if (output === undefined) return [this.runItem(run)];
    const shown = element("pre", { class: "output", "aria-label": `Output of ${run.id}` }, output);
    const row = element("tr", { class: "run-output" }, element("td", { colspan: "6" }, shown));
    return [this.runItem(run), row];
  }

  private runItem(run: Run): HTMLElement {
    const signal = run.stopSignal;
    const first = run.firstSequence;
    const steps = !run.lastSequence ? "" : first === run.lastSequence ? `#${first}` : `#${first}–#${run.lastSequence}`;
    const cell = (className: string, label: string, text: string, title = ""): HTMLElement =>
      element("td", { class: className, "data-label": label, ...(title ? { title } : {}) }, text);
    return element(
      "tr",
      { class: "run", "data-run": run.id },
      cell("id", "Run", run.id),
      cell("agent", "Agent", run.agent),
      cell("status", "Status", RunStatus[run.status] ?? String(run.status)),
      cell("reason", "Stop reason", signal ? stopReasonName(signal.reason) : "", signal?.message ?? ""),
      cell("steps", "Steps", steps),
      cell("meta", "Started", when(run.createTime?.seconds)),
    );
  }

  // -- runs -----------------------------------------------------------------------------

  private async send(): Promise<void> {
    const input = byId<HTMLTextAreaElement>("input");
    const text = input.value.trim();
    if (!text || this.abort) return;
    input.value = "";
    const agent = byId<HTMLSelectElement>("agent").value;
    await this.stream(element("div", { class: "sent" }, text), (signal) =>
      this.clients.agents.run({ sessionId: this.session, agent, input: text }, { signal }),
    );
  }

  private async retry(sequence: bigint): Promise<void> {
    if (this.abort) return;
    const sessionId = this.session;
    await this.stream(element("div", { class: "sent retry" }, `Retry from #${sequence}`), (signal) =>
      this.clients.agents.retry({ sessionId, sequence }, { signal }),
    );
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

  /** Shows a run's events as they arrive, under what started it (the message sent, or the
   * retry): text, tool calls, tool results, the stop reason. */
  private async stream(opening: HTMLElement, call: (signal: AbortSignal) => AsyncIterable<StepEvent>): Promise<void> {
    this.abort = new AbortController();
    const live = byId("live");
    const status = element("div", { class: "status" }, "running…");
    live.replaceChildren(opening, status);
    delete live.dataset.run;
    let sessionId = this.session;
    let ended: Run | undefined;
    let mark = "";
    // What the step being written has shown so far; it is in the timeline once stored.
    let text: HTMLElement | undefined;
    let unstored: HTMLElement[] = [];
    const show = (shown: HTMLElement): void => {
      live.insertBefore(shown, status);
    };
    byId<HTMLButtonElement>("cancel").disabled = false;
    // The session is the run's until it ends: a retry meanwhile would be refused (SESSION_BUSY).
    for (const open of document.querySelectorAll("#steps .confirm")) open.remove();
    for (const button of document.querySelectorAll<HTMLButtonElement>("#steps .retry")) {
      button.disabled = true;
      button.title = "A run is going on in this session: wait for its end, or cancel it.";
    }
    try {
      for await (const event of call(this.abort.signal)) {
        const { case: kind, value } = event.event;
        if (kind === "runStarted") {
          this.liveRun = event.runId;
          sessionId = event.sessionId;
          if (!this.session) {
            this.session = event.sessionId;
            byId("session-title").textContent = event.sessionId;
          }
          live.dataset.run = event.runId;
        } else if (kind === "stepStarted") {
          text = undefined;
          unstored = [];
        } else if (kind === "stepDelta") {
          if (value.content) {
            if (!text) {
              text = element("div", { class: "content streaming" });
              unstored.push(text);
              show(text);
            }
            text.textContent += value.content;
          }
          for (const fragment of value.toolCalls) {
            if (fragment.name) {
              const started = element("div", { class: "tool-call started" }, `calling ${fragment.name}`);
              started.dataset.tool = fragment.name;
              unstored.push(started);
              show(started);
            }
          }
        } else if (kind === "stepCompleted") {
          text = undefined;
          unstored = [];
          const step = value.step;
          if (step?.role === Role.TOOL) {
            show(element("div", { class: `tool-result${step.isError ? " error" : ""}` }, `${step.name} → ${step.content}`));
          }
        } else if (kind === "runCompleted" || kind === "runFailed") {
          ended = value.run;
          const signal = ended?.stopSignal;
          mark = signal ? stopReasonName(signal.reason).toLowerCase() : "ended";
          status.textContent = signal
            ? `${stopReasonName(signal.reason)}${signal.message ? `: ${signal.message}` : ""}`
            : "ended";
          status.classList.add("ended");
          const output = ended ? outputJson(ended) : undefined;
          if (output !== undefined) show(element("pre", { class: "output" }, output));
        } else if (kind === "toolProgress") {
          const said = value.message || value.state;
          show(element("div", { class: "tool-progress" }, `${value.name} … ${said}`));
        } else if (kind === "error") {
          show(element("div", { class: "event-error" }, value.message));
        }
      }
    } catch (error) {
      status.textContent = "failed";
      mark = "stream failed";
      this.showError(error);
    } finally {
      this.abort = undefined;
      this.liveRun = "";
      byId<HTMLButtonElement>("cancel").disabled = true;
    }
    if (unstored.length && sessionId) this.keepUnfinished(sessionId, unstored, ended, mark);
    await this.reloadSessions();
    if (this.session) await this.loadSession();
  }

  /** Moves a step's output that was never stored from the live view to the timeline. */
  private keepUnfinished(sessionId: string, shown: HTMLElement[], ended: Run | undefined, mark: string): void {
    const output: Unfinished = {
      afterStepId: "",
      afterSequence: ended?.lastSequence ?? 0n,
      content: shown.filter((node) => !node.dataset.tool).map((node) => node.textContent ?? "").join(""),
      toolCalls: shown.flatMap((node) => (node.dataset.tool ? [node.dataset.tool] : [])),
      mark,
    };
    for (const node of shown) node.remove();
    this.unfinished.set(sessionId, [...(this.unfinished.get(sessionId) ?? []), output]);
  }
}

void new Console().start();
