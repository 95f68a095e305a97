package agio_test

// The client conformance scenario, Go edition; the same checks, with the same names, as
// tests/conformance/scenario.py (which documents them) and clients/ts/src/conformance.
// scripts/conformance.py starts the servers and sets the two addresses:
//
//	AGIO_CONFORMANCE_ADDRESS       a server on the built-in fake model
//	AGIO_CONFORMANCE_SLOW_ADDRESS  a server on a paced fake model (a run that lasts)
//
// and, for the runs over TLS, what the CLIs read too: AGIO_CA_FILE (and for mutual TLS
// AGIO_CERT_FILE and AGIO_KEY_FILE), and AGIO_TOKEN.
//
// Without the addresses the test is skipped, so `go test ./...` needs no server.

import (
	"context"
	"crypto/rand"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	agio "github.com/agio-grpc/agio-grpc/clients/go"
	agiov1 "github.com/agio-grpc/agio-grpc/clients/go/gen/agio/v1"
)

const (
	callTimeout = 10 * time.Second
	runTimeout  = 30 * time.Second
	pageSize    = 2
)

func TestConformance(t *testing.T) {
	address, slowAddress := os.Getenv("AGIO_CONFORMANCE_ADDRESS"), os.Getenv("AGIO_CONFORMANCE_SLOW_ADDRESS")
	if address == "" || slowAddress == "" {
		t.Skip("AGIO_CONFORMANCE_ADDRESS and AGIO_CONFORMANCE_SLOW_ADDRESS not set (scripts/conformance.py sets them)")
	}
	// The trace context travels the way an instrumented application sends it: the
	// otelgrpc stats handler that agio.Dial installs injects the W3C traceparent of the
	// span context in the call's ctx.
	otel.SetTextMapPropagator(propagation.TraceContext{})
	client := dial(t, address)
	slow := dial(t, slowAddress)

	var toolRun *agiov1.Run
	var traceID trace.TraceID

	t.Run("health", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		status, err := client.Health(ctx)
		if err != nil || status != "SERVING" {
			t.Fatalf("health: %q, %v", status, err)
		}
	})

	t.Run("run_with_tool", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
		defer cancel()
		traceID = randomTraceID(t)
		ctx = trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: traceID, SpanID: randomSpanID(t), TraceFlags: trace.FlagsSampled, Remote: true,
		}))
		stream, err := client.Run(ctx, &agiov1.RunRequest{Input: "What is 12 * 7?"})
		if err != nil {
			t.Fatal(err)
		}
		var events []*agiov1.StepEvent
		var calls []string
		for event, err := range stream.Events() {
			if err != nil {
				t.Fatal(err)
			}
			events = append(events, event)
			for _, call := range event.GetStepCompleted().GetStep().GetToolCalls() {
				calls = append(calls, call.GetName())
			}
		}
		if len(events) == 0 {
			t.Fatal("no events")
		}
		for i, event := range events {
			if event.GetSeq() != int64(i+1) {
				t.Fatalf("event %d has seq %d: not gapless from 1", i, event.GetSeq())
			}
		}
		last := events[len(events)-1]
		toolRun = last.GetRunCompleted().GetRun()
		if toolRun == nil {
			t.Fatalf("the stream ended with %T", last.GetEvent())
		}
		if strings.Join(calls, ",") != "calculate" {
			t.Errorf("tool calls %v", calls)
		}
		if reason := toolRun.GetStopSignal().GetReason(); reason != agiov1.StopReason_STOP_REASON_COMPLETED {
			t.Errorf("stop reason %s", reason)
		}
		result, err := client.GetRun(ctx, toolRun.GetId())
		if err != nil || result.GetStepCount() < 3 {
			t.Errorf("GetRun: %v, %v", result, err)
		}
	})

	t.Run("trace_id", func(t *testing.T) {
		if toolRun == nil {
			t.Fatal("no run to check (run_with_tool failed)")
		}
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		stored, err := client.GetRun(ctx, toolRun.GetId())
		if err != nil {
			t.Fatal(err)
		}
		if toolRun.GetTraceId() != traceID.String() || stored.GetTraceId() != traceID.String() {
			t.Fatalf("sent trace id %s, run has %q (GetRun %q)", traceID, toolRun.GetTraceId(), stored.GetTraceId())
		}
	})

	t.Run("cancel", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
		defer cancel()
		stream, err := slow.Run(ctx, &agiov1.RunRequest{Input: "Tell me a long story."})
		if err != nil {
			t.Fatal(err)
		}
		cancelled := false
		var terminal *agiov1.Run
		for event, err := range stream.Events() {
			if err != nil {
				t.Fatal(err)
			}
			if !cancelled && event.GetStepDelta().GetContent() != "" {
				cancelled = true
				if _, err := slow.CancelRun(ctx, event.GetRunId(), "conformance"); err != nil {
					t.Fatal(err)
				}
			}
			if run := agio.TerminalRun(event); run != nil {
				terminal = run
			}
		}
		if !cancelled || terminal == nil {
			t.Fatalf("cancelled %v, terminal run %v", cancelled, terminal)
		}
		if reason := terminal.GetStopSignal().GetReason(); reason != agiov1.StopReason_STOP_REASON_CANCELLED {
			t.Errorf("stop reason %s", reason)
		}
		stored, err := slow.GetRun(ctx, terminal.GetId())
		if err != nil {
			t.Fatal(err)
		}
		if stored.GetStatus() != agiov1.RunStatus_RUN_STATUS_CANCELLED {
			t.Errorf("GetRun status %s", stored.GetStatus())
		}
	})

	t.Run("not_found", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
		defer cancel()
		stream, err := client.Run(ctx, &agiov1.RunRequest{SessionId: "no-such-session", Input: "hi"})
		if err == nil {
			_, err = agio.Collect(stream)
		}
		var agioErr *agio.Error
		if !errors.As(err, &agioErr) {
			t.Fatalf("want an *agio.Error, got %v", err)
		}
		if agioErr.Code != codes.NotFound || agioErr.Reason != "SESSION_NOT_FOUND" || agioErr.Domain != agio.ErrorDomain {
			t.Fatalf("got %s (reason %q, domain %q)", agioErr.Code, agioErr.Reason, agioErr.Domain)
		}
	})

	t.Run("list_steps", func(t *testing.T) {
		if toolRun == nil {
			t.Fatal("no session to list (run_with_tool failed)")
		}
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		var sequences []int64
		for step, err := range client.ListSteps(ctx, toolRun.GetSessionId(), pageSize) {
			if err != nil {
				t.Fatal(err)
			}
			sequences = append(sequences, step.GetSequence())
		}
		session, err := client.GetSession(ctx, toolRun.GetSessionId())
		if err != nil {
			t.Fatal(err)
		}
		if len(sequences) <= pageSize {
			t.Fatalf("only %d steps: paging not exercised", len(sequences))
		}
		for i, sequence := range sequences {
			if sequence != int64(i+1) {
				t.Fatalf("sequences %v: not gapless from 1", sequences)
			}
		}
		if int64(len(sequences)) != session.GetStepCount() {
			t.Fatalf("%d steps listed, session has %d", len(sequences), session.GetStepCount())
		}
	})

	t.Run("background_resume", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
		defer cancel()
		run, err := client.StartRun(ctx, &agiov1.RunRequest{Input: "What is 12 * 7?"})
		if err != nil {
			t.Fatal(err)
		}
		// Read two events, drop the stream, resume from the cursor to the terminal event.
		watchCtx, drop := context.WithCancel(ctx)
		stream, err := client.WatchRun(watchCtx, run.GetId(), 0)
		if err != nil {
			t.Fatal(err)
		}
		var seen []*agiov1.StepEvent
		for event, err := range stream.Events() {
			if err != nil {
				t.Fatal(err)
			}
			if seen = append(seen, event); len(seen) == 2 {
				break
			}
		}
		drop()
		if len(seen) != 2 || seen[0].GetRunStarted() == nil {
			t.Fatalf("the first two events: %v", seen)
		}
		cursor := seen[1].GetSeq()
		var rest []*agiov1.StepEvent
		for event, err := range client.FollowRun(ctx, run.GetId(), cursor, 3) {
			if err != nil {
				t.Fatal(err)
			}
			rest = append(rest, event)
		}
		if len(rest) == 0 || rest[0].GetSeq() <= cursor {
			t.Fatalf("resumed from %d with %v", cursor, rest)
		}
		final := agio.TerminalRun(rest[len(rest)-1])
		if final == nil || final.GetStopSignal().GetReason() != agiov1.StopReason_STOP_REASON_COMPLETED {
			t.Fatalf("the resumed stream ended with %v", rest[len(rest)-1])
		}
	})

	t.Run("follow_after_end", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
		defer cancel()
		run, err := client.StartRun(ctx, &agiov1.RunRequest{Input: "What is 12 * 7?"})
		if err != nil {
			t.Fatal(err)
		}
		var terminalSeq int64
		for event, err := range client.FollowRun(ctx, run.GetId(), 0, 3) {
			if err != nil {
				t.Fatal(err)
			}
			terminalSeq = event.GetSeq()
		}
		after := 0
		for _, err := range client.FollowRun(ctx, run.GetId(), terminalSeq, 3) {
			if err != nil {
				t.Fatal(err)
			}
			after++
		}
		if terminalSeq == 0 || after != 0 {
			t.Fatalf("%d events after the terminal event's seq %d", after, terminalSeq)
		}
	})

	t.Run("tls_hint", func(t *testing.T) {
		// The other transport: TLS to a plaintext server, plaintext to a TLS one.
		var opts []grpc.DialOption
		want := agio.ConnectionClosed
		if os.Getenv("AGIO_CA_FILE") == "" {
			creds, err := agio.TLSConfig{}.Credentials()
			if err != nil {
				t.Fatal(err)
			}
			opts, want = append(opts, grpc.WithTransportCredentials(creds)), agio.ServerWithoutTLS
		}
		wrong, err := agio.Dial(address, opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer wrong.Close()
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		_, err = wrong.Health(ctx)
		var decoded *agio.Error
		if !errors.As(err, &decoded) || decoded.Code != codes.Unavailable || decoded.TLSFailure != want {
			t.Fatalf("want Unavailable with %v, got %v", want, err)
		}
		if !strings.Contains(err.Error(), "AGIO_CA_FILE") {
			t.Fatalf("the error does not name AGIO_CA_FILE: %v", err)
		}
	})

	t.Run("structured_output", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
		defer cancel()
		schema := map[string]any{
			"type":                 "object",
			"properties":           map[string]any{"answer": map[string]any{"type": "integer"}},
			"required":             []string{"answer"},
			"additionalProperties": false,
		}
		result, output, err := client.RunForOutput(ctx, &agiov1.RunRequest{Input: "What is 12 * 7?"}, schema)
		if err != nil {
			t.Fatal(err)
		}
		if reason := result.Run.GetStopSignal().GetReason(); reason != agiov1.StopReason_STOP_REASON_COMPLETED {
			t.Fatalf("stop reason %s", reason)
		}
		var calls []string
		for _, step := range result.Steps {
			for _, call := range step.GetToolCalls() {
				calls = append(calls, call.GetName())
			}
		}
		if strings.Join(calls, ",") != "calculate" {
			t.Errorf("tool calls %v", calls)
		}
		answer, ok := output.(map[string]any)
		if !ok || len(answer) != 1 || answer["answer"] != float64(0) {
			t.Errorf("output %#v", output)
		}
	})

	t.Run("approval", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
		defer cancel()
		stream, err := client.Run(ctx, &agiov1.RunRequest{Input: "What is 12 * 7?", RequireApproval: []string{"calculate"}})
		if err != nil {
			t.Fatal(err)
		}
		first, err := agio.Collect(stream)
		if err != nil {
			t.Fatal(err)
		}
		waiting := first.Run
		if waiting.GetStatus() != agiov1.RunStatus_RUN_STATUS_REQUIRES_ACTION {
			t.Fatalf("status %s", waiting.GetStatus())
		}
		held := waiting.GetRequiredAction().GetApprovals()
		if len(held) != 1 || held[0].GetName() != "calculate" {
			t.Fatalf("waiting for %v", held)
		}
		approved, err := client.Approve(ctx, waiting.GetId(), nil, "")
		if err != nil {
			t.Fatal(err)
		}
		done, err := agio.Collect(approved)
		if err != nil {
			t.Fatal(err)
		}
		if done.Run.GetId() != waiting.GetId() || done.Run.GetStopSignal().GetReason() != agiov1.StopReason_STOP_REASON_COMPLETED {
			t.Fatalf("stop %s", done.Run.GetStopSignal().GetReason())
		}
		if len(done.Steps) == 0 || !done.Steps[0].GetApproval().GetApproved() {
			t.Fatalf("the result keeps no approval: %v", done.Steps)
		}
		if !strings.Contains(done.Text, "84") {
			t.Fatalf("final text %q", done.Text)
		}
	})
}

func dial(t *testing.T, address string) *agio.Client {
	t.Helper()
	var opts []grpc.DialOption
	files := agio.TLSConfig{
		CAFile: os.Getenv("AGIO_CA_FILE"), CertFile: os.Getenv("AGIO_CERT_FILE"), KeyFile: os.Getenv("AGIO_KEY_FILE"),
	}
	if files != (agio.TLSConfig{}) {
		creds, err := files.Credentials()
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, grpc.WithTransportCredentials(creds))
	}
	if token := os.Getenv("AGIO_TOKEN"); token != "" {
		opts = append(opts, agio.WithToken(token))
	}
	client, err := agio.Dial(address, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return client
}

func randomTraceID(t *testing.T) trace.TraceID {
	var id trace.TraceID
	if _, err := rand.Read(id[:]); err != nil {
		t.Fatal(err)
	}
	return id
}

func randomSpanID(t *testing.T) trace.SpanID {
	var id trace.SpanID
	if _, err := rand.Read(id[:]); err != nil {
		t.Fatal(err)
	}
	return id
}
