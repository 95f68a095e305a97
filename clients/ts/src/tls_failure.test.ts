// A client whose TLS settings do not fit the server is told what to change: against real
// HTTP/2 servers on 127.0.0.1 (plaintext, TLS, mutual TLS) with certificates made by the
// openssl command for the test. `npm test` runs it (after `npm run build`).
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import * as http2 from "node:http2";
import * as net from "node:net";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { Code } from "@connectrpc/connect";
import { connectNodeAdapter } from "@connectrpc/connect-node";

import { AgioClient, type TlsConfig } from "./client.js";
import { AgioError } from "./errors.js";
import { AgentService } from "./gen/agio/v1/agent_service_pb.js";
import { AgioTlsError, TLS_HINTS, TlsFailure } from "./tls_failure.js";

const dir = mkdtempSync(join(tmpdir(), "agio-tls-"));
const servers: http2.Http2Server[] = [];
const sessions: http2.ServerHttp2Session[] = [];
after(() => {
  for (const session of sessions) session.destroy();
  for (const server of servers) server.close();
  rmSync(dir, { recursive: true, force: true });
});

function openssl(...args: string[]): void {
  execFileSync("openssl", args, { cwd: dir, stdio: "pipe" });
}

const NEW_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];

/** A self-signed CA: `NAME.pem`, `NAME.key`. */
function makeCa(name: string): void {
  openssl("req", "-x509", ...NEW_KEY, "-keyout", `${name}.key`, "-out", `${name}.pem`,
    "-days", "1", "-subj", `/CN=${name}`);
}

/** A certificate `NAME.pem` (key `NAME.key`) the CA `ca` signed, with `extension`. */
function issue(ca: string, name: string, extension: string): void {
  openssl("req", ...NEW_KEY, "-keyout", `${name}.key`, "-out", `${name}.csr`,
    "-subj", `/CN=${name}`);
  writeFileSync(join(dir, `${name}.ext`), `${extension}\n`);
  openssl("x509", "-req", "-in", `${name}.csr`, "-CA", `${ca}.pem`, "-CAkey", `${ca}.key`,
    "-CAcreateserial", "-days", "1", "-out", `${name}.pem`, "-extfile", `${name}.ext`);
}

function file(name: string): string {
  return join(dir, name);
}

const routes = connectNodeAdapter({
  grpc: true,
  routes: (router) => router.service(AgentService, { listAgents: () => ({ agents: [] }) }),
});

async function listening(server: http2.Http2Server | http2.Http2SecureServer): Promise<string> {
  servers.push(server as http2.Http2Server);
  server.on("session", (session) => sessions.push(session as http2.ServerHttp2Session));
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return `127.0.0.1:${(server.address() as AddressInfo).port}`;
}

const address = { tls: "", mutualTls: "", plaintext: "" };

before(async () => {
  makeCa("ca");
  makeCa("stranger");
  issue("ca", "server", "subjectAltName=IP:127.0.0.1,DNS:localhost");
  const served = { key: readFileSync(file("server.key")), cert: readFileSync(file("server.pem")) };
  address.tls = await listening(http2.createSecureServer(served, routes));
  address.mutualTls = await listening(
    http2.createSecureServer(
      { ...served, ca: readFileSync(file("ca.pem")), requestCert: true, rejectUnauthorized: true },
      routes,
    ),
  );
  address.plaintext = await listening(http2.createServer(routes));
});

/** The error of a call by a client with `tls`; fails the test if the call succeeded. */
async function refusal(target: string, tls: TlsConfig | boolean): Promise<AgioError> {
  const client = new AgioClient(target, { tls, timeoutMs: 10_000 });
  try {
    await client.listAgents();
  } catch (error) {
    assert.ok(error instanceof AgioError, `not an AgioError: ${String(error)}`);
    return error;
  }
  assert.fail("the call succeeded");
}

function assertSaysWhatToChange(error: AgioError, failure: TlsFailure, names: string): void {
  assert.ok(error instanceof AgioTlsError, `no TLS failure found in: ${error.message}`);
  assert.equal(error.tlsFailure, failure, error.message);
  assert.ok(error.message.endsWith(`(${failure}: ${TLS_HINTS[failure]})`), error.message);
  assert.ok(error.message.includes(names), error.message);
}

test("a plaintext client of a TLS server is told to give the CA file", async () => {
  const error = await refusal(address.tls, false);
  assertSaysWhatToChange(error, TlsFailure.ServerWantsTls, "AGIO_CA_FILE");
});

test("a client that does not trust the server's CA is told to name it", async () => {
  const error = await refusal(address.tls, { caFile: file("stranger.pem") });
  assertSaysWhatToChange(error, TlsFailure.UntrustedCertificate, "tls.caFile");
});

test("a client without a certificate of a mutual TLS server is told to give one", async () => {
  const error = await refusal(address.mutualTls, { caFile: file("ca.pem") });
  assertSaysWhatToChange(error, TlsFailure.HandshakeRefused, "tls.certFile");
});

test("a TLS client of a plaintext server is told to leave TLS out", async () => {
  const error = await refusal(address.plaintext, { caFile: file("ca.pem") });
  assertSaysWhatToChange(error, TlsFailure.ServerWithoutTls, "leave out --tls");
});

test("the right CA file gets in, and a refused connection is no TLS failure", async () => {
  const client = new AgioClient(address.tls, { tls: { caFile: file("ca.pem") } });
  assert.deepEqual(await client.listAgents(), []);
  for (const tls of [false, { caFile: file("ca.pem") }]) {
    const error = await refusal(await unusedAddress(), tls);
    assert.ok(!(error instanceof AgioTlsError), error.message);
    assert.equal(error.code, Code.Unavailable);
  }
});

/** An address nothing listens on (a port just given back). */
async function unusedAddress(): Promise<string> {
  const probe = net.createServer();
  await new Promise<void>((resolve) => probe.listen(0, "127.0.0.1", resolve));
  const { port } = probe.address() as AddressInfo;
  await new Promise<void>((resolve, reject) =>
    probe.close((error) => (error ? reject(error) : resolve())),
  );
  return `127.0.0.1:${port}`;
}
