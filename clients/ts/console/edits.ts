// Which retries and forks the server accepts at a step, decided from the session's steps the
// console has loaded, with the server's own reasons. The rules are the server's:
// `Runtime._retry` and `retry_plan` (agio_grpc/engine/runtime.py, engine/segments.py) for a
// retry, `SessionServicer._refuse_open_calls` (agio_grpc/service/session_service.py) for a
// fork, and `open_tool_calls` (engine/context.py) for both. The server decides again on the
// call; this only keeps the page from offering what it would refuse, and says what an
// accepted edit will do before it is done. Never touches the DOM.
import { Role, RunStatus, type Run, type Step, type ToolCall } from "../src/web.js";

/** An edit the server accepts, with what it will do, or one it refuses, with why. */
export type Offer = { accepted: true; says: string } | { accepted: false; why: string };

/** The last assistant step of `steps` and its tool calls that no later tool step answers
 * (summary steps, which stand for earlier ones, are passed over). */
export function openToolCalls(steps: readonly Step[]): { assistant?: Step; open: ToolCall[] } {
  for (let index = steps.length - 1; index >= 0; index--) {
    const step = steps[index];
    if (step.role === Role.SUMMARY) continue;
    if (step.role === Role.ASSISTANT) {
      const answered = new Set(
        steps.slice(index + 1).filter((later) => later.role === Role.TOOL).map((later) => later.toolCallId),
      );
      return { assistant: step, open: step.toolCalls.filter((call) => !answered.has(call.id)) };
    }
    if (step.role !== Role.TOOL) break;
  }
  return { open: [] };
}

/** ForkSession at `steps[index]`: a new session with steps 1..that one. */
export function forkOffer(steps: readonly Step[], index: number): Offer {
  const sequence = steps[index].sequence;
  const { assistant, open } = openToolCalls(steps.slice(0, index + 1));
  if (assistant && open.length) {
    const ids = open.map((call) => call.id).join(", ");
    return {
      accepted: false,
      why:
        `Forking at #${sequence} would leave the tool calls of step #${assistant.sequence} without ` +
        `results (${ids}): fork at #${assistant.sequence - 1n}, or at the last result of those calls.`,
    };
  }
  return { accepted: true, says: `Copies steps #1–#${sequence} into a new session and opens it.` };
}

/** Why the session's runs keep any retry of it from starting ("" when nothing does), from
 * its runs as last read: the store's `restart_run` refuses while one of them holds the
 * session, waits in its queue (SESSION_BUSY) or waits for its client (RUN_REQUIRES_ACTION). */
export function retryBlocker(runs: readonly Run[]): string {
  const waiting = runs.find((run) => run.status === RunStatus.REQUIRES_ACTION);
  if (waiting) {
    return `Run ${waiting.id} waits for its client's tool outputs: no retry until it is continued or cancelled.`;
  }
  const going = runs.find((run) => run.status === RunStatus.RUNNING || run.status === RunStatus.QUEUED);
  if (going) return `Run ${going.id} has this session: no retry until it ends (open the session again then).`;
  return "";
}

/** Retry at `steps[index]`: its steps from that one on are deleted and the agent goes on from
 * the step before. `agentOf` names the agent of the run that wrote a step (a retry runs with
 * it), "" when unknown. */
export function retryOffer(steps: readonly Step[], index: number, agentOf: (step: Step) => string): Offer {
  const kept = steps.slice(0, index);
  if (!kept.length) {
    return {
      accepted: false,
      why: "A retry keeps at least one step to regenerate from: step #1 has none before it.",
    };
  }
  // A summary step stands for earlier steps: the turn to go on from is the last other one.
  const last = [...kept].reverse().find((step) => step.role !== Role.SUMMARY) ?? kept[kept.length - 1];
  if (last.role === Role.ASSISTANT && !last.toolCalls.length) {
    return {
      accepted: false,
      why:
        `Step #${last.sequence} before it is a final assistant reply: nothing to regenerate ` +
        `(retry from #${last.sequence} to regenerate that reply).`,
    };
  }
  const agent = agentOf(kept[kept.length - 1]);
  const runs = agent ? ` It runs with the agent ${agent}, the agent of the run that wrote #${kept[kept.length - 1].sequence}.` : "";
  return { accepted: true, says: `${deletes(steps.slice(index))}, then ${goesOn(kept, last)}.${runs}` };
}

function deletes(deleted: readonly Step[]): string {
  const first = deleted[0].sequence;
  const end = deleted[deleted.length - 1].sequence;
  const range = first === end ? `step #${first}` : `steps #${first}–#${end}`;
  const users = deleted.filter((step) => step.role === Role.USER).map((step) => `#${step.sequence}`);
  if (!users.length) return `Deletes ${range}`;
  const messages = users.length === 1 ? `the user message ${users[0]}` : `the user messages ${users.join(", ")}`;
  return `Deletes ${range} (${messages} among them)`;
}

function goesOn(kept: readonly Step[], last: Step): string {
  if (last.role === Role.USER) return `the model answers #${last.sequence} again`;
  const question = [...kept].reverse().find((step) => step.role === Role.USER);
  const answer = question ? `its answer to #${question.sequence}` : "its answer";
  const { assistant, open } = openToolCalls(kept);
  if (assistant && open.length) {
    const names = open.map((call) => call.name).join(", ");
    return `the tool calls of #${assistant.sequence} that have no result run again (${names}) and the model continues ${answer}`;
  }
  return `the model continues ${answer} from #${last.sequence}`;
}
