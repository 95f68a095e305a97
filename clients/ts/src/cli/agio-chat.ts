#!/usr/bin/env node
// agio-chat: stream one agent run — the reply as it is generated, tool calls and their
// results, then the stop reason and usage.
//
//   node dist/cli/agio-chat.js [--address HOST:PORT] [--session ID] MESSAGE
//
// --address defaults to AGIO_ADDRESS, else 127.0.0.1:50051 (a URL such as https://host:port
// works too).
import { parseArgs } from "node:util";

import { AgioClient, Role, StopReason, terminalRun } from "../index.js";

const DEFAULT_ADDRESS = "127.0.0.1:50051";

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    address: { type: "string", default: process.env.AGIO_ADDRESS || DEFAULT_ADDRESS },
    session: { type: "string", default: "" },
    agent: { type: "string", default: "" },
  },
});

async function main(): Promise<number> {
  if (positionals.length === 0) {
    console.error("usage: agio-chat [--address HOST:PORT] [--session ID] [--agent NAME] MESSAGE");
    console.error(`  --address defaults to AGIO_ADDRESS, else ${DEFAULT_ADDRESS}`);
    return 2;
  }
  const client = new AgioClient(values.address);
  const abort = new AbortController();
  process.once("SIGINT", () => abort.abort());
  const request = { input: positionals.join(" "), sessionId: values.session, agent: values.agent };
  for await (const event of client.run(request, { signal: abort.signal })) {
    const { case: kind, value } = event.event;
    if (kind === "stepDelta") {
      process.stdout.write(value.content);
    } else if (kind === "stepCompleted" && value.step) {
      for (const call of value.step.toolCalls) {
        process.stdout.write(`\n-> ${call.name}(${call.arguments})\n`);
      }
      if (value.step.role === Role.TOOL) {
        process.stdout.write(`<- ${value.step.content}\n`);
      }
    }
    const run = terminalRun(event);
    if (run) {
      const signal = run.stopSignal;
      const usage = run.usage;
      console.log(
        `\n[${StopReason[signal?.reason ?? 0]}] ${signal?.message ?? ""} | tokens in ` +
          `${usage?.inputTokens ?? 0} out ${usage?.outputTokens ?? 0} | steps ${run.stepCount}` +
          ` | session ${run.sessionId}`,
      );
      return 0;
    }
  }
  console.error("the run stream ended without a terminal event");
  return 1;
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    console.error(`agio-chat: ${error instanceof Error ? error.message : String(error)}`);
    process.exit(1);
  },
);
