// Connections of the gRPC transport (Node, HTTP/2) that fail in or around their TLS
// handshake: which mistake of the client's TLS settings it looks like, and what to change.
// The web transport never sees one (the browser or fetch does TLS), so this stays out of
// errors.ts, which the browser build shares.
import { Code } from "@connectrpc/connect";

import { AgioError } from "./errors.js";

/** Why the connection failed, as far as the error tells (no call reached the server). */
export enum TlsFailure {
  /** A plaintext client whose connection the server closed at once. */
  ServerWantsTls = "the server may speak TLS",
  UntrustedCertificate = "the server's certificate is not signed by a CA the client trusts",
  /** A TLS client that got no TLS answer. */
  ServerWithoutTls = "the server speaks plaintext",
  /** A TLS client whose connection the server closed or refused in the handshake: most often a
   * mutual TLS server and a client without a certificate its CA signed. */
  HandshakeRefused = "the server refused the TLS handshake",
}

/** What to change, in the client's options and agio-chat's. */
export const TLS_HINTS: Record<TlsFailure, string> = {
  [TlsFailure.ServerWantsTls]:
    "connect with tls: { caFile } naming the CA that signed its certificate (agio-chat: " +
    "--ca-file or AGIO_CA_FILE; --tls for a public CA)",
  [TlsFailure.UntrustedCertificate]:
    "name the CA that signed it in tls.caFile (agio-chat: --ca-file or AGIO_CA_FILE)",
  [TlsFailure.ServerWithoutTls]:
    "connect without tls (agio-chat: leave out --tls, --ca-file and AGIO_CA_FILE)",
  [TlsFailure.HandshakeRefused]:
    "with mutual TLS it wants a client certificate a CA it accepts signed: tls.certFile and " +
    "tls.keyFile (agio-chat: --cert-file, --key-file); and tls.caFile for the server's CA " +
    "(--ca-file or AGIO_CA_FILE)",
};

/** An AgioError of a connection that failed in its TLS handshake: its message ends with what
 * to change. */
export class AgioTlsError extends AgioError {
  constructor(
    decoded: AgioError,
    readonly tlsFailure: TlsFailure,
  ) {
    super(
      decoded.code,
      decoded.rawMessage,
      decoded.reason,
      decoded.domain,
      decoded.metadata,
      decoded.fieldViolations,
      { cause: decoded.cause },
    );
    this.message += ` (${tlsFailure}: ${TLS_HINTS[tlsFailure]})`;
  }
}

// Node's codes for a server certificate no trusted CA signed.
const UNTRUSTED = new Set([
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "UNABLE_TO_GET_ISSUER_CERT",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "SELF_SIGNED_CERT_IN_CHAIN",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "CERT_UNTRUSTED",
]);

function causeCodes(error: unknown): string[] {
  const codes: string[] = [];
  for (let cause = error; cause instanceof Error; cause = cause.cause) {
    const code = (cause as NodeJS.ErrnoException).code;
    if (typeof code === "string") codes.push(code);
  }
  return codes;
}

/** The TlsFailure `decoded` shows, for a client that speaks TLS (`tls`) or plaintext. */
export function tlsFailureOf(decoded: AgioError, tls: boolean): TlsFailure | undefined {
  const codes = causeCodes(decoded.cause);
  if (codes.some((code) => UNTRUSTED.has(code))) return TlsFailure.UntrustedCertificate;
  if (codes.includes("ERR_SSL_WRONG_VERSION_NUMBER")) return TlsFailure.ServerWithoutTls;
  if (codes.some((code) => code.startsWith("ERR_SSL_") && code.includes("ALERT"))) {
    return TlsFailure.HandshakeRefused;
  }
  // The HTTP/2 session the server closed before any answer: connect-node reports its stream
  // cancelled, plaintext or TLS alike.
  const closed =
    decoded.code === Code.Canceled &&
    decoded.rawMessage.includes("http/2 stream closed with error code CANCEL");
  if (!closed) return undefined;
  return tls ? TlsFailure.HandshakeRefused : TlsFailure.ServerWantsTls;
}

/** `decoded`, or an AgioTlsError when it is a TLS failure. */
export function withTlsFailure(decoded: AgioError, tls: boolean): AgioError {
  const failure = tlsFailureOf(decoded, tls);
  return failure === undefined ? decoded : new AgioTlsError(decoded, failure);
}
