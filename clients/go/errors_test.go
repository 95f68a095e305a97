package agio_test

import (
	"errors"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	agio "github.com/agio-grpc/agio-grpc/clients/go"
)

func TestDecodeErrorReadsErrorInfoAndBadRequest(t *testing.T) {
	st, err := status.New(codes.InvalidArgument, "invalid request: page_size: must be >= 0").WithDetails(
		&errdetails.ErrorInfo{Reason: "INVALID_ARGUMENT", Domain: agio.ErrorDomain, Metadata: map[string]string{"k": "v"}},
		&errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
			{Field: "page_size", Description: "must be >= 0"},
		}},
	)
	if err != nil {
		t.Fatal(err)
	}
	decoded := agio.DecodeError(st.Err())
	var agioErr *agio.Error
	if !errors.As(decoded, &agioErr) {
		t.Fatalf("want *agio.Error, got %T", decoded)
	}
	if agioErr.Code != codes.InvalidArgument || agioErr.Reason != "INVALID_ARGUMENT" || agioErr.Domain != agio.ErrorDomain {
		t.Fatalf("decoded %+v", agioErr)
	}
	if agioErr.Metadata["k"] != "v" || agioErr.FieldViolations["page_size"] != "must be >= 0" {
		t.Fatalf("details %+v", agioErr)
	}
	if status.Code(decoded) != codes.InvalidArgument || agio.Reason(decoded) != "INVALID_ARGUMENT" {
		t.Fatalf("status.Code %s, Reason %q", status.Code(decoded), agio.Reason(decoded))
	}
}

func TestDecodeErrorLeavesOtherErrorsAlone(t *testing.T) {
	plain := errors.New("not a status")
	if agio.DecodeError(plain) != plain || agio.DecodeError(nil) != nil {
		t.Fatal("a non-status error was changed")
	}
}
