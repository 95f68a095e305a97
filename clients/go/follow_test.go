package agio_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	agio "github.com/agio-grpc/agio-grpc/clients/go"
	agiov1 "github.com/agio-grpc/agio-grpc/clients/go/gen/agio/v1"
)

// endedRun answers every WatchRun as the server does for a cursor at a run's terminal
// event: an empty stream with status OK.
type endedRun struct {
	agiov1.UnimplementedAgentServiceServer
	watches atomic.Int32
}

func (s *endedRun) WatchRun(*agiov1.WatchRunRequest, grpc.ServerStreamingServer[agiov1.StepEvent]) error {
	s.watches.Add(1)
	return nil
}

func TestFollowRunFromTheTerminalEventEndsAtOnceWithOneWatch(t *testing.T) {
	service := &endedRun{}
	server := grpc.NewServer()
	agiov1.RegisterAgentServiceServer(server, service)
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = server.Serve(listener) }()
	t.Cleanup(server.Stop)
	client, err := agio.Dial(listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var events []*agiov1.StepEvent
	for event, err := range client.FollowRun(ctx, "run_ended", 11, 3) {
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, event)
	}
	if len(events) != 0 || service.watches.Load() != 1 {
		t.Fatalf("%d events after %d watches; want none after one", len(events), service.watches.Load())
	}
}
