package agio_test

// One client, several servers: the target Dial builds from several addresses, and its
// round_robin balancing, against two real gRPC servers on 127.0.0.1 that count the calls
// they receive.

import (
	"context"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	agio "github.com/agio-grpc/agio-grpc/clients/go"
	agiov1 "github.com/agio-grpc/agio-grpc/clients/go/gen/agio/v1"
)

func TestAddressesOfATarget(t *testing.T) {
	cases := []struct {
		target string
		want   []string
	}{
		{"127.0.0.1:50051", []string{"127.0.0.1:50051"}},
		{"dns:///agio.internal:50051", []string{"dns:///agio.internal:50051"}},
		{"127.0.0.1:5001,127.0.0.1:5002", []string{"127.0.0.1:5001", "127.0.0.1:5002"}},
		{" a.internal:5001 , [::1]:5001 ", []string{"a.internal:5001", "[::1]:5001"}},
		{" , ", nil},
	}
	for _, c := range cases {
		if got := agio.Addresses(c.target); !slices.Equal(got, c.want) {
			t.Errorf("Addresses(%q) = %q, want %q", c.target, got, c.want)
		}
	}
	if _, err := agio.Dial(" , "); err == nil {
		t.Error("Dial of no address succeeded")
	}
}

// countingServer answers ListAgents and counts the calls.
type countingServer struct {
	agiov1.UnimplementedAgentServiceServer
	calls atomic.Int64
}

func (s *countingServer) ListAgents(context.Context, *agiov1.ListAgentsRequest) (*agiov1.ListAgentsResponse, error) {
	s.calls.Add(1)
	return &agiov1.ListAgentsResponse{}, nil
}

func serveCounting(t *testing.T) (*countingServer, string) {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	counter := &countingServer{}
	server := grpc.NewServer()
	agiov1.RegisterAgentServiceServer(server, counter)
	go func() { _ = server.Serve(listener) }()
	t.Cleanup(server.Stop)
	return counter, listener.Addr().String()
}

func TestDialSpreadsCallsOverSeveralServers(t *testing.T) {
	first, firstAddress := serveCounting(t)
	second, secondAddress := serveCounting(t)
	client, err := agio.Dial(strings.Join([]string{firstAddress, secondAddress}, ","))
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Until both are connected, calls go to whichever is.
	for first.calls.Load() == 0 || second.calls.Load() == 0 {
		if _, err := client.ListAgents(ctx); err != nil {
			t.Fatal(err)
		}
	}
	before := [2]int64{first.calls.Load(), second.calls.Load()}
	for range 10 {
		if _, err := client.ListAgents(ctx); err != nil {
			t.Fatal(err)
		}
	}
	got := [2]int64{first.calls.Load() - before[0], second.calls.Load() - before[1]}
	if got != [2]int64{5, 5} {
		t.Fatalf("10 calls over two connected servers went %v, want 5 each (round robin)", got)
	}
}
