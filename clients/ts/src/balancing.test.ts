// One client, several servers: the addresses a target names, and the client's round robin,
// against two real gRPC servers on 127.0.0.1 (connect-node over HTTP/2) that count the
// calls they receive. `npm test` runs it (after `npm run build`).
import assert from "node:assert/strict";
import { lookup } from "node:dns/promises";
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { after, test } from "node:test";

import { connectNodeAdapter } from "@connectrpc/connect-node";

import { addresses, dnsTarget } from "./balancing.js";
import { AgioClient } from "./client.js";
import { AgentService } from "./gen/agio/v1/agent_service_pb.js";

test("a target names one server, or several separated by commas", () => {
  assert.deepEqual(addresses("127.0.0.1:50051"), ["127.0.0.1:50051"]);
  assert.deepEqual(addresses(" 10.0.0.1:1 , agio.internal:2 "), ["10.0.0.1:1", "agio.internal:2"]);
  assert.deepEqual(addresses(["a:1", "b:2,c:3"]), ["a:1", "b:2", "c:3"]);
  assert.throws(() => addresses(" , "), /no server address given/);
  assert.deepEqual(dnsTarget("dns:///agio.internal:50051"), { host: "agio.internal", port: "50051" });
  assert.deepEqual(dnsTarget("dns://8.8.8.8/agio.internal:1"), { host: "agio.internal", port: "1" });
  assert.equal(dnsTarget("agio.internal:50051"), undefined);
});

interface CountingServer {
  address: string;
  calls: () => number;
}

const servers: http2.Http2Server[] = [];
const sessions: http2.ServerHttp2Session[] = [];
after(() => {
  // The clients' HTTP/2 sessions end with the servers' (the test process can then exit).
  for (const session of sessions) session.destroy();
  for (const server of servers) server.close();
});

async function serveCounting(): Promise<CountingServer> {
  let calls = 0;
  const server = http2.createServer(
    connectNodeAdapter({
      grpc: true,
      routes: (router) =>
        router.service(AgentService, {
          listAgents() {
            calls += 1;
            return { agents: [] };
          },
        }),
    }),
  );
  servers.push(server);
  server.on("session", (session) => sessions.push(session));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return { address: `127.0.0.1:${port}`, calls: () => calls };
}

test("calls go round robin over several servers", async () => {
  const [first, second] = [await serveCounting(), await serveCounting()];
  const client = new AgioClient(`${first.address},${second.address}`);
  for (let n = 0; n < 10; n++) {
    await client.listAgents();
  }
  assert.deepEqual([first.calls(), second.calls()], [5, 5]);
});

test("a dns:/// target goes to the addresses its name resolves to", async (context) => {
  const resolved = await lookup("localhost", { all: true });
  if (!resolved.some(({ address }) => address === "127.0.0.1")) {
    context.skip("localhost does not resolve to 127.0.0.1 here");
    return;
  }
  const server = await serveCounting();
  const port = server.address.split(":")[1];
  const client = new AgioClient(`dns:///localhost:${port}`);
  // localhost may resolve to ::1 too, where nothing listens: some call reaches 127.0.0.1.
  for (let n = 0; n < 4 && server.calls() === 0; n++) {
    await client.listAgents().catch(() => undefined);
  }
  assert.ok(server.calls() > 0);
});
