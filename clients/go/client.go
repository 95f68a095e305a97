// Package agio is a thin Go client for agio-grpc (the agio.v1 contract).
//
// It wraps the generated stubs in gen/agio/v1: one connection with OpenTelemetry
// propagation (otelgrpc); Run, SubmitToolOutputs, Retry and WatchRun returning the stream of
// StepEvents; every other AgentService and SessionService call as a typed method, with the
// List calls as iterators over all pages; and a health check. Every failed call returns an
// *Error that carries the status code and the server's stable google.rpc.ErrorInfo reason.
//
//	client, err := agio.Dial("127.0.0.1:50051")  // or "10.0.0.1:50051,10.0.0.2:50051", "dns:///agio.internal:50051"
//	stream, err := client.Run(ctx, &agiov1.RunRequest{Input: "What is 12 * 7?"})
//	result, err := agio.Collect(stream)
//	fmt.Println(result.Text, result.Run.GetStopSignal().GetReason())
//
// The raw stubs stay available as Client.Agents and Client.Sessions.
//
// Over TLS, with a token (mutual TLS: the client's CertFile and KeyFile as well):
//
//	creds, err := agio.TLSConfig{CAFile: "ca.pem"}.Credentials()
//	client, err := agio.Dial("agio.internal:50051", grpc.WithTransportCredentials(creds),
//		agio.WithToken(token))
package agio

import (
	"context"
	"errors"
	"io"
	"iter"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"

	agiov1 "github.com/agio-grpc/agio-grpc/clients/go/gen/agio/v1"
)

// pages iterates over the items of a paged List call, following page tokens to the end.
func pages[T any](fetch func(token string) ([]T, string, error)) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		token := ""
		for {
			items, next, err := fetch(token)
			if err != nil {
				var zero T
				yield(zero, DecodeError(err))
				return
			}
			for _, item := range items {
				if !yield(item, nil) {
					return
				}
			}
			if token = next; token == "" {
				return
			}
		}
	}
}

// Client is one connection to an agio-grpc server and typed calls on it. It is safe for
// concurrent use; Close releases the connection.
type Client struct {
	conn *grpc.ClientConn
	// Agents is the raw AgentService stub.
	Agents agiov1.AgentServiceClient
	// Sessions is the raw SessionService stub.
	Sessions agiov1.SessionServiceClient
	health   healthpb.HealthClient
}

// RoundRobin is the service config Dial gives every connection: calls go to each address
// the target names (or its DNS name resolves to) in turn, skipping those not connected.
const RoundRobin = `{"loadBalancingConfig": [{"round_robin": {}}]}`

// Addresses are the servers a Dial target names: one address ("host:port", or a target
// with its scheme such as "dns:///agio.internal:50051", kept whole), or several "host:port"
// separated by commas (AGIO_ADDRESS).
func Addresses(target string) []string {
	if hasScheme(target) {
		return []string{target}
	}
	var parts []string
	for _, part := range strings.Split(target, ",") {
		if part = strings.TrimSpace(part); part != "" {
			parts = append(parts, part)
		}
	}
	return parts
}

var schemes = []string{"dns:", "unix:", "unix-abstract:", "passthrough:", "xds:"}

func hasScheme(target string) bool {
	for _, scheme := range schemes {
		if strings.HasPrefix(target, scheme) {
			return true
		}
	}
	return false
}

// serversScheme names the resolver of a connection to several addresses (grpc-go has no
// "ipv4:" list target): a manual resolver holding them, one per connection.
const serversScheme = "agio-servers"

// targetOptions is the grpc.NewClient target for the addresses, with the resolver that
// several of them need.
func targetOptions(addresses []string) (string, []grpc.DialOption, error) {
	switch len(addresses) {
	case 0:
		return "", nil, errors.New("no server address given")
	case 1:
		return addresses[0], nil, nil
	}
	servers := manual.NewBuilderWithScheme(serversScheme)
	state := resolver.State{}
	for _, address := range addresses {
		state.Addresses = append(state.Addresses, resolver.Address{Addr: address})
	}
	servers.InitialState(state)
	return serversScheme + ":///" + strings.Join(addresses, ","), []grpc.DialOption{grpc.WithResolvers(servers)}, nil
}

// Dial connects to target: one server's "host:port", a gRPC target, or several servers'
// addresses separated by commas (see Addresses), which the calls go to round robin. Without
// options the connection is plaintext and carries the OpenTelemetry context of each
// call's ctx (otelgrpc with the global tracer provider and propagators, so an application
// that set up OpenTelemetry gets its trace continued by the server). Options are
// appended, so they can replace the credentials (grpc.WithTransportCredentials of
// TLSConfig.Credentials), add a token (WithToken) or interceptors.
func Dial(target string, opts ...grpc.DialOption) (*Client, error) {
	resolved, resolvers, err := targetOptions(Addresses(target))
	if err != nil {
		return nil, err
	}
	defaults := append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler()),
		grpc.WithDefaultServiceConfig(RoundRobin),
	}, resolvers...)
	conn, err := grpc.NewClient(resolved, append(defaults, opts...)...)
	if err != nil {
		return nil, err
	}
	return NewClient(conn), nil
}

// NewClient wraps a connection the caller made (and still owns: Close closes it).
func NewClient(conn *grpc.ClientConn) *Client {
	return &Client{
		conn:     conn,
		Agents:   agiov1.NewAgentServiceClient(conn),
		Sessions: agiov1.NewSessionServiceClient(conn),
		health:   healthpb.NewHealthClient(conn),
	}
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

// RunStream is the event stream of one run. The last event is run_completed or run_failed;
// cancelling the ctx given to Run cancels the call, and with it the run on the server.
type RunStream struct {
	stream grpc.ServerStreamingClient[agiov1.StepEvent]
}

// Recv returns the next event, io.EOF after the last one, or an *Error.
func (s *RunStream) Recv() (*agiov1.StepEvent, error) {
	event, err := s.stream.Recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, io.EOF
		}
		return nil, DecodeError(err)
	}
	return event, nil
}

// Events iterates over the remaining events; an error (never io.EOF) ends the iteration.
func (s *RunStream) Events() iter.Seq2[*agiov1.StepEvent, error] {
	return func(yield func(*agiov1.StepEvent, error) bool) {
		for {
			event, err := s.Recv()
			if errors.Is(err, io.EOF) {
				return
			}
			if !yield(event, err) || err != nil {
				return
			}
		}
	}
}

// runStream wraps a started run stream, or decodes the error that prevented it.
func runStream(stream grpc.ServerStreamingClient[agiov1.StepEvent], err error) (*RunStream, error) {
	if err != nil {
		return nil, DecodeError(err)
	}
	return &RunStream{stream: stream}, nil
}

// RunResult is what a whole run produced, collected by Collect.
type RunResult struct {
	// Run is the final run from the terminal event, with its stop signal and usage.
	Run *agiov1.Run
	// Text is the content of the last assistant step that had any.
	Text string
	// Steps are the stored steps the run produced, in order.
	Steps []*agiov1.Step
	// Events counts the events received.
	Events int
}

// Collect drains a run stream to its terminal event.
func Collect(stream *RunStream) (*RunResult, error) {
	result := &RunResult{}
	for event, err := range stream.Events() {
		if err != nil {
			return nil, err
		}
		result.Events++
		if step := event.GetStepCompleted().GetStep(); step != nil {
			result.Steps = append(result.Steps, step)
			if step.GetRole() == agiov1.Role_ROLE_ASSISTANT && step.GetContent() != "" {
				result.Text = step.GetContent()
			}
		}
		if run := TerminalRun(event); run != nil {
			result.Run = run
			return result, nil
		}
	}
	return nil, &Error{Code: codes.Unknown, Message: "the run stream ended without a terminal event"}
}

// TerminalRun is the final run carried by a run_completed or run_failed event, else nil.
func TerminalRun(event *agiov1.StepEvent) *agiov1.Run {
	if run := event.GetRunCompleted().GetRun(); run != nil {
		return run
	}
	return event.GetRunFailed().GetRun()
}

// Health returns the server's serving status name, e.g. "SERVING".
func (c *Client) Health(ctx context.Context) (string, error) {
	resp, err := c.health.Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return "", DecodeError(err)
	}
	return resp.GetStatus().String(), nil
}
