"""What the command line says about a call the server refused, or a connection that failed:
the status, the reason and the server's words, then, where those name protocol details (the
`authorization` metadata, an RPC name) or a client setting, what to do with this command's
options instead. Never calls the server."""

from __future__ import annotations

from agio_grpc.client import AgioError, TlsFailure

TLS_HINTS = {
    TlsFailure.SERVER_WANTS_TLS: "give the CA that signed its certificate with --ca-file or "
    "AGIO_CA_FILE (--tls for a public CA)",
    TlsFailure.UNTRUSTED_CERTIFICATE: "give the CA that signed it with --ca-file or AGIO_CA_FILE",
    TlsFailure.SERVER_WITHOUT_TLS: "leave out --tls, --ca-file and AGIO_CA_FILE",
    TlsFailure.HANDSHAKE_REFUSED: "with mutual TLS it wants a client certificate a CA it "
    "accepts signed: --cert-file and --key-file (AGIO_CERT_FILE, AGIO_KEY_FILE); and "
    "--ca-file (AGIO_CA_FILE) for the server's CA",
}

_TOKEN = "--token or AGIO_TOKEN"


def error_line(error: AgioError) -> str:
    """One line: `CODE [REASON]: message`, with the CLI's way out where there is one."""
    reason = f" [{error.reason}]" if error.reason else ""
    message = " ".join(_message(error).split())
    return f"{error.code.name}{reason}: {message}"


def _message(error: AgioError) -> str:
    if error.tls_failure is not None:
        return f"{error.message} ({error.tls_failure.value}: {TLS_HINTS[error.tls_failure]})"
    reason, metadata = error.reason, error.metadata
    if reason == "CREDENTIALS_MISSING":
        key = " (an API key: `agio-grpc keys create`)" if metadata.get("mode") == "api_key" else ""
        return f"the server wants a credential: give it with {_TOKEN}{key}"
    if reason in ("CREDENTIALS_INVALID", "CREDENTIALS_EXPIRED", "KEY_REVOKED"):
        return f"{error.message} (the credential of {_TOKEN})"
    if reason == "RUN_REQUIRES_ACTION" and metadata.get("run_id"):
        run_id = metadata["run_id"]
        return (
            f"the session's run {run_id} waits for its client tool outputs: answer them "
            f"(`agio-grpc runs show {run_id}` lists the calls, `agio-grpc submit {run_id} "
            f"CALL_ID=OUTPUT...`) or cancel it (`agio-grpc runs cancel {run_id}`)"
        )
    if reason == "SESSION_BUSY":
        return f"{error.message} (`chat --on-busy enqueue` queues behind it)"
    return error.message
