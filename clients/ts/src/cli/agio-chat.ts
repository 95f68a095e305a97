#!/usr/bin/env node
// agio-chat: stream one agent run — the reply as it is generated, tool calls and their
// results, then the stop reason and usage.
//
//   node dist/cli/agio-chat.js [--address HOST:PORT] [--session ID] MESSAGE
//
// --address defaults to AGIO_ADDRESS, else 127.0.0.1:50051 (a URL such as https://host:port
// works too; several separated by commas, or dns:///host:port, are called round robin). A server that wants them gets a token (--token, else AGIO_TOKEN) as
// `authorization: Bearer`, and TLS: --ca-file (AGIO_CA_FILE), or --tls for Node's roots;
// mutual TLS adds --cert-file and --key-file (AGIO_CERT_FILE, AGIO_KEY_FILE).
import { parseArgs } from "node:util";

import { AgioClient, Role, StopReason, terminalRun, type TlsConfig } from "../index.js";

const DEFAULT_ADDRESS = "127.0.0.1:50051";
const env = process.env;

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    address: { type: "string", default: env.AGIO_ADDRESS || DEFAULT_ADDRESS },
    session: { type: "string", default: "" },
    agent: { type: "string", default: "" },
    token: { type: "string", default: env.AGIO_TOKEN ?? "" },
    tls: { type: "boolean", default: false },
    "ca-file": { type: "string", default: env.AGIO_CA_FILE ?? "" },
    "cert-file": { type: "string", default: env.AGIO_CERT_FILE ?? "" },
    "key-file": { type: "string", default: env.AGIO_KEY_FILE ?? "" },
  },
});

/** TLS as the options ask: the files when one is given, Node's roots for --tls alone. */
function tlsOption(): TlsConfig | boolean {
  const files = {
    caFile: values["ca-file"] || undefined,
    certFile: values["cert-file"] || undefined,
    keyFile: values["key-file"] || undefined,
  };
  return files.caFile || files.certFile || files.keyFile ? files : values.tls;
}

async function main(): Promise<number> {
  if (positionals.length === 0) {
    console.error(
      "usage: agio-chat [--address HOST:PORT] [--session ID] [--agent NAME] [--token TOKEN]\n" +
        "                 [--tls | --ca-file PEM] [--cert-file PEM --key-file PEM] MESSAGE",
    );
    console.error(
      `  --address defaults to AGIO_ADDRESS, else ${DEFAULT_ADDRESS}; --token to AGIO_TOKEN;\n` +
        "  --ca-file, --cert-file, --key-file to AGIO_CA_FILE, AGIO_CERT_FILE, AGIO_KEY_FILE",
    );
    return 2;
  }
  let client: AgioClient;
  try {
    client = new AgioClient(values.address, { token: values.token || undefined, tls: tlsOption() });
  } catch (error) {
    console.error(`agio-chat: ${error instanceof Error ? error.message : String(error)}`);
    return 2;
  }
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
    } else if (kind === "toolProgress") {
      const said = value.message ? `: ${value.message}` : "";
      console.error(`  .. ${value.name} ${value.state}${said}`);
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
