// followRun from a cursor at a run's terminal event: the server answers WatchRun with an
// empty stream and status OK, and followRun ends at once, with one call and no event.
// Against a real gRPC server on 127.0.0.1 (connect-node over HTTP/2). `npm test` runs it.
import assert from "node:assert/strict";
import * as http2 from "node:http2";
import type { AddressInfo } from "node:net";
import { after, test } from "node:test";

import { connectNodeAdapter } from "@connectrpc/connect-node";

import { AgioClient } from "./client.js";
import { AgentService } from "./gen/agio/v1/agent_service_pb.js";
import type { StepEvent } from "./gen/agio/v1/events_pb.js";

const sessions: http2.ServerHttp2Session[] = [];
let closeServer = (): void => undefined;
after(() => {
  for (const session of sessions) session.destroy();
  closeServer();
});

test("following from the terminal event's seq ends at once with one watch", async () => {
  let watches = 0;
  const server = http2.createServer(
    connectNodeAdapter({
      grpc: true,
      routes: (router) =>
        router.service(AgentService, {
          // An ended run's stream after its terminal event: nothing, status OK.
          async *watchRun() {
            watches += 1;
          },
        }),
    }),
  );
  closeServer = () => server.close();
  server.on("session", (session) => sessions.push(session));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const client = new AgioClient(`127.0.0.1:${(server.address() as AddressInfo).port}`);

  const events: StepEvent[] = [];
  for await (const event of client.followRun("run_ended", 11n, 3)) {
    events.push(event);
  }
  assert.deepEqual(events, []);
  assert.equal(watches, 1);
});
