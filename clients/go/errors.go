package agio

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of every agio-grpc error.
const ErrorDomain = "agio-grpc"

// Error is a call the server could not serve: the status code and message, and from the
// status details the ErrorInfo (reason, domain, metadata) and any BadRequest violations.
type Error struct {
	Code    codes.Code
	Message string
	// Reason is the stable ErrorInfo reason, e.g. "SESSION_NOT_FOUND".
	Reason   string
	Domain   string
	Metadata map[string]string
	// FieldViolations maps each invalid request field to why it is invalid.
	FieldViolations map[string]string
	// TLSFailure is set when the connection failed in its TLS handshake (or, plaintext,
	// looks as if the server wanted one): Error then says what to change.
	TLSFailure TLSFailure
	cause      error
}

func (e *Error) Error() string {
	text := fmt.Sprintf("%s: %s", e.Code, e.Message)
	if e.Reason != "" {
		text = fmt.Sprintf("%s [%s]: %s", e.Code, e.Reason, e.Message)
	}
	if e.TLSFailure != NoTLSFailure {
		text += " (" + e.TLSFailure.String() + ": " + tlsHints[e.TLSFailure] + ")"
	}
	return text
}

// TLSFailure says why a connection failed in or around its TLS handshake, as far as the
// transport's error tells (no call reached the server).
type TLSFailure int

const (
	// NoTLSFailure: the error is not about TLS.
	NoTLSFailure TLSFailure = iota
	// ConnectionClosed: the server closed the connection before its HTTP/2 preface, as a
	// TLS server does to a plaintext client, and a mutual TLS server to a TLS client
	// without a certificate it accepts (the transport's error does not tell which).
	ConnectionClosed
	// UntrustedCertificate: the server's certificate is signed by no CA the client trusts.
	UntrustedCertificate
	// ServerWithoutTLS: a TLS client that got no TLS answer.
	ServerWithoutTLS
	// HandshakeRefused: the server refused the handshake with a TLS alert, most often a
	// mutual TLS server and a client without a certificate its CA signed.
	HandshakeRefused
)

func (f TLSFailure) String() string {
	switch f {
	case ConnectionClosed:
		return "the server closed the connection at once"
	case UntrustedCertificate:
		return "the server's certificate is not signed by a CA the client trusts"
	case ServerWithoutTLS:
		return "the server speaks plaintext"
	case HandshakeRefused:
		return "the server refused the TLS handshake"
	}
	return "no TLS failure"
}

// tlsHints say what to change, in the client's terms and agio-chat's.
var tlsHints = map[TLSFailure]string{
	ConnectionClosed: "if it speaks TLS, dial with TLS credentials trusting the CA that signed " +
		"its certificate: TLSConfig.CAFile (agio-chat: -ca-file or AGIO_CA_FILE); with mutual " +
		"TLS, a client certificate too: TLSConfig.CertFile and KeyFile (-cert-file, -key-file)",
	UntrustedCertificate: "name the CA that signed it in TLSConfig.CAFile " +
		"(agio-chat: -ca-file or AGIO_CA_FILE)",
	ServerWithoutTLS: "dial without TLS credentials (agio-chat: leave out -tls, -ca-file and AGIO_CA_FILE)",
	HandshakeRefused: "with mutual TLS it wants a client certificate a CA it accepts signed: " +
		"TLSConfig.CertFile and KeyFile (agio-chat: -cert-file, -key-file); and CAFile for " +
		"the server's CA (-ca-file or AGIO_CA_FILE)",
}

// tlsFailureOf reads the TLSFailure in a failed connection's status message (grpc-go's
// transport errors).
func tlsFailureOf(code codes.Code, message string) TLSFailure {
	if code != codes.Unavailable {
		return NoTLSFailure
	}
	switch {
	case strings.Contains(message, "certificate signed by unknown authority"):
		return UntrustedCertificate
	case strings.Contains(message, "first record does not look like a TLS handshake"):
		return ServerWithoutTLS
	case strings.Contains(message, "remote error: tls:"):
		return HandshakeRefused
	case strings.Contains(message, "error reading server preface: EOF"),
		strings.HasPrefix(message, "write tcp ") && strings.HasSuffix(message, "write: broken pipe"):
		return ConnectionClosed
	}
	return NoTLSFailure
}

// Unwrap gives the original gRPC error, so status.FromError still works on an *Error.
func (e *Error) Unwrap() error { return e.cause }

// GRPCStatus lets status.Code and status.FromError read the code of an *Error.
func (e *Error) GRPCStatus() *status.Status {
	if s, ok := status.FromError(e.cause); ok {
		return s
	}
	return status.New(e.Code, e.Message)
}

// DecodeError turns a gRPC error into an *Error with its details decoded. Errors that carry
// no gRPC status (nil, or already an *Error) are returned as they are.
func DecodeError(err error) error {
	if err == nil {
		return nil
	}
	var decoded *Error
	if errors.As(err, &decoded) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	decoded = &Error{
		Code: st.Code(), Message: st.Message(), TLSFailure: tlsFailureOf(st.Code(), st.Message()), cause: err,
	}
	for _, detail := range st.Details() {
		switch d := detail.(type) {
		case *errdetails.ErrorInfo:
			decoded.Reason, decoded.Domain, decoded.Metadata = d.GetReason(), d.GetDomain(), d.GetMetadata()
		case *errdetails.BadRequest:
			decoded.FieldViolations = map[string]string{}
			for _, v := range d.GetFieldViolations() {
				decoded.FieldViolations[v.GetField()] = v.GetDescription()
			}
		}
	}
	return decoded
}

// Reason is the ErrorInfo reason of err, or "" when it carries none.
func Reason(err error) string {
	var decoded *Error
	if errors.As(err, &decoded) {
		return decoded.Reason
	}
	if decodedErr, ok := DecodeError(err).(*Error); ok {
		return decodedErr.Reason
	}
	return ""
}
