package main

// The relay against live agio-grpc servers. scripts/conformance.py starts them and sets:
//
//	AGIO_CONFORMANCE_ADDRESS       a server on the built-in fake model
//	AGIO_CONFORMANCE_SLOW_ADDRESS  a server on a paced fake model (a run that lasts)
//
// Without them the test is skipped, so `go test ./...` needs no server. The relay itself
// runs here, on 127.0.0.1:0, and is called over TCP as any other service would call it.

import (
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	agio "github.com/agio-grpc/agio-grpc/clients/go"
	agiov1 "github.com/agio-grpc/agio-grpc/clients/go/gen/agio/v1"
)

const runTimeout = 30 * time.Second

func TestRelay(t *testing.T) {
	address, slowAddress := os.Getenv("AGIO_CONFORMANCE_ADDRESS"), os.Getenv("AGIO_CONFORMANCE_SLOW_ADDRESS")
	if address == "" || slowAddress == "" {
		t.Skip("AGIO_CONFORMANCE_ADDRESS and AGIO_CONFORMANCE_SLOW_ADDRESS not set (scripts/conformance.py sets them)")
	}
	otel.SetTextMapPropagator(propagation.TraceContext{})
	fast, slow := dialAgio(t, address), dialAgio(t, slowAddress)

	t.Run("restreams_the_run_in_the_callers_trace", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
		defer cancel()
		traceID := randomTraceID(t)
		ctx = trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
			TraceID: traceID, SpanID: randomSpanID(t), TraceFlags: trace.FlagsSampled, Remote: true,
		}))
		stream, err := Ask(ctx, startRelay(t, fast), "What is 12 * 7?")
		if err != nil {
			t.Fatal(err)
		}
		events := receiveAll(t, stream)
		for i, event := range events {
			if event.GetSeq() != int64(i+1) {
				t.Fatalf("event %d has seq %d: agio's events are not re-streamed one for one", i, event.GetSeq())
			}
		}
		run := events[len(events)-1].GetRunCompleted().GetRun()
		if run.GetStopSignal().GetReason() != agiov1.StopReason_STOP_REASON_COMPLETED {
			t.Fatalf("the relayed stream ended with %v", events[len(events)-1])
		}
		stored, err := fast.GetRun(ctx, run.GetId())
		if err != nil {
			t.Fatal(err)
		}
		if stored.GetTraceId() != traceID.String() {
			t.Fatalf("the caller's trace id is %s, agio's run has %q", traceID, stored.GetTraceId())
		}
	})

	t.Run("passes_agios_errors_on", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
		defer cancel()
		stream, err := Ask(ctx, startRelay(t, fast), "")
		if err == nil {
			_, err = stream.Recv()
		}
		if status.Code(err) != codes.InvalidArgument || agio.Reason(agio.DecodeError(err)) != "INVALID_ARGUMENT" {
			t.Fatalf("an empty question: %v (reason %q)", err, agio.Reason(agio.DecodeError(err)))
		}
	})

	t.Run("cancelling_the_call_cancels_agios_run", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
		defer cancel()
		callCtx, hangUp := context.WithCancel(ctx)
		defer hangUp()
		stream, err := Ask(callCtx, startRelay(t, slow), "Tell me a long story.")
		if err != nil {
			t.Fatal(err)
		}
		runID := ""
		for runID == "" {
			event, err := stream.Recv()
			if err != nil {
				t.Fatalf("before any text: %v", err)
			}
			if event.GetStepDelta().GetContent() != "" {
				runID = event.GetRunId()
			}
		}
		hangUp()
		// agio's own record of the run, followed to its end: a run the relay failed to cancel
		// would stream on and complete.
		var final *agiov1.Run
		for event, err := range slow.FollowRun(ctx, runID, 0, 3) {
			if err != nil {
				t.Fatal(err)
			}
			final = agio.TerminalRun(event)
		}
		if final.GetStopSignal().GetReason() != agiov1.StopReason_STOP_REASON_CANCELLED {
			t.Fatalf("agio's run ended %s", final.GetStopSignal().GetReason())
		}
		stored, err := slow.GetRun(ctx, runID)
		if err != nil {
			t.Fatal(err)
		}
		if stored.GetStatus() != agiov1.RunStatus_RUN_STATUS_CANCELLED {
			t.Fatalf("GetRun status %s", stored.GetStatus())
		}
	})
}

// startRelay serves the relay in front of client on 127.0.0.1:0 and returns a connection to
// it that sends the trace context of each call's ctx.
func startRelay(t *testing.T, client *agio.Client) *grpc.ClientConn {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	server := NewServer(client)
	go func() { _ = server.Serve(listener) }()
	t.Cleanup(server.Stop)
	conn, err := grpc.NewClient(listener.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

func dialAgio(t *testing.T, address string) *agio.Client {
	t.Helper()
	client, err := agio.Dial(address)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return client
}

// receiveAll reads the stream to its end; it fails the test unless the last event is terminal.
func receiveAll(t *testing.T, stream grpc.ServerStreamingClient[agiov1.StepEvent]) []*agiov1.StepEvent {
	t.Helper()
	var events []*agiov1.StepEvent
	for {
		event, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, event)
	}
	if len(events) == 0 || agio.TerminalRun(events[len(events)-1]) == nil {
		t.Fatalf("%d events and no terminal one", len(events))
	}
	return events
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
