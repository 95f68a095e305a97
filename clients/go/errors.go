package agio

import (
	"errors"
	"fmt"

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
	cause           error
}

func (e *Error) Error() string {
	if e.Reason != "" {
		return fmt.Sprintf("%s [%s]: %s", e.Code, e.Reason, e.Message)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
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
	decoded = &Error{Code: st.Code(), Message: st.Message(), cause: err}
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
