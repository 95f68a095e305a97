// Run "What is 12 * 7?" to its end, then list the session's stored steps.
import { AgioClient, Role, StopReason } from "@agio-grpc/client";

const client = new AgioClient(process.env.AGIO_ADDRESS ?? "127.0.0.1:50051");
const result = await client.runToEnd({ input: "What is 12 * 7?" });
console.log(result.text, StopReason[result.run.stopSignal?.reason ?? 0]);
for await (const step of client.listSteps(result.run.sessionId)) {
  const calls = step.toolCalls.map((call) => `${call.name}(${call.arguments})`).join(", ");
  console.log(`${step.sequence}`, Role[step.role], step.content || calls);
}
