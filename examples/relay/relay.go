package main

import (
	"context"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"

	agio "github.com/agio-grpc/agio-grpc/clients/go"
	agiov1 "github.com/agio-grpc/agio-grpc/clients/go/gen/agio/v1"
)

// askMethod is the relay's one RPC, as a .proto would declare it:
//
//	service Relay {
//	  rpc Ask(google.protobuf.StringValue) returns (stream agio.v1.StepEvent);
//	}
//
// Both messages exist already (the question is a StringValue, the answer agio's own events),
// so the service is registered by hand below and needs no generated code.
const askMethod = "/relay.v1.Relay/Ask"

// asker is the handler type of relay.v1.Relay.
type asker interface {
	Ask(question *wrapperspb.StringValue, out grpc.ServerStreamingServer[agiov1.StepEvent]) error
}

var relayService = grpc.ServiceDesc{
	ServiceName: "relay.v1.Relay",
	HandlerType: (*asker)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    "Ask",
		ServerStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			question := new(wrapperspb.StringValue)
			if err := stream.RecvMsg(question); err != nil {
				return err
			}
			out := &grpc.GenericServerStream[wrapperspb.StringValue, agiov1.StepEvent]{ServerStream: stream}
			return srv.(asker).Ask(question, out)
		},
	}},
}

// Relay answers each question with one agio-grpc run and re-streams the run's events.
type Relay struct {
	agio *agio.Client
}

// Ask runs the question on agio-grpc and sends on every event of the run.
//
// The incoming stream's context is the outgoing call's context, and that is the whole of the
// propagation: the otelgrpc server handler put the caller's trace in it (so agio's run joins
// that trace, through the otelgrpc client handler agio.Dial installs), and gRPC cancels it
// when the caller cancels or its deadline passes (so agio's run ends CANCELLED, or TIMEOUT
// before the same deadline).
func (r *Relay) Ask(question *wrapperspb.StringValue, out grpc.ServerStreamingServer[agiov1.StepEvent]) error {
	stream, err := r.agio.Run(out.Context(), &agiov1.RunRequest{Input: question.GetValue()})
	if err != nil {
		return err
	}
	for event, err := range stream.Events() {
		if err != nil {
			// An *agio.Error keeps agio's status: the caller gets its code, reason and details.
			return err
		}
		if err := out.Send(event); err != nil {
			return err
		}
	}
	return nil
}

// NewServer is a gRPC server with relay.v1.Relay answered through client; it extracts the
// caller's trace context from each call (otelgrpc, with the global propagator).
func NewServer(client *agio.Client) *grpc.Server {
	server := grpc.NewServer(grpc.StatsHandler(otelgrpc.NewServerHandler()))
	server.RegisterService(&relayService, &Relay{agio: client})
	return server
}

// Ask calls relay.v1.Relay/Ask on conn and returns the stream of the run's events.
func Ask(ctx context.Context, conn grpc.ClientConnInterface, question string) (grpc.ServerStreamingClient[agiov1.StepEvent], error) {
	stream, err := conn.NewStream(ctx, &relayService.Streams[0], askMethod)
	if err != nil {
		return nil, err
	}
	events := &grpc.GenericClientStream[wrapperspb.StringValue, agiov1.StepEvent]{ClientStream: stream}
	if err := events.SendMsg(wrapperspb.String(question)); err != nil {
		return nil, err
	}
	if err := events.CloseSend(); err != nil {
		return nil, err
	}
	return events, nil
}
