// Command relay is a service in front of agio-grpc: its one RPC, relay.v1.Relay/Ask, answers
// a question with an agio-grpc run and re-streams the run's events, passing on the caller's
// trace and cancellation (relay.go says how).
//
//	go run ./relay serve [-listen 127.0.0.1:50061] [-agio HOST:PORT]
//	go run ./relay ask [-relay 127.0.0.1:50061] "What is 12 * 7?"
//
// -agio defaults to AGIO_ADDRESS, else 127.0.0.1:50051.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	agio "github.com/agio-grpc/agio-grpc/clients/go"
)

const defaultRelayAddress = "127.0.0.1:50061"

func main() {
	// W3C trace context in and out; an application with an OpenTelemetry SDK also gets the
	// relay's own server and client spans between its caller's and agio's.
	otel.SetTextMapPropagator(propagation.TraceContext{})
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "ask":
		err = ask(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: relay serve [-listen HOST:PORT] [-agio HOST:PORT]")
	fmt.Fprintln(os.Stderr, "       relay ask [-relay HOST:PORT] QUESTION")
	os.Exit(2)
}

// serve answers relay.v1.Relay on -listen until SIGINT or SIGTERM.
func serve(args []string) error {
	flags := flag.NewFlagSet("serve", flag.ExitOnError)
	listen := flags.String("listen", defaultRelayAddress, "host:port to serve on (port 0 picks one)")
	address := flags.String("agio", agioAddress(), "agio-grpc server host:port (AGIO_ADDRESS, else 127.0.0.1:50051)")
	_ = flags.Parse(args)

	client, err := agio.Dial(*address)
	if err != nil {
		return err
	}
	defer client.Close()
	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	server := NewServer(client)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		server.GracefulStop()
	}()
	log.Printf("relay listening on %s, agio-grpc at %s", listener.Addr(), *address)
	return server.Serve(listener)
}

// ask calls the relay with one question and prints the streamed text and the stop reason.
func ask(args []string) error {
	flags := flag.NewFlagSet("ask", flag.ExitOnError)
	relay := flags.String("relay", defaultRelayAddress, "the relay's host:port")
	timeout := flags.Duration("timeout", time.Minute, "deadline of the call (agio's run gets the same)")
	_ = flags.Parse(args)
	if flags.NArg() == 0 {
		usage()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	conn, err := grpc.NewClient(*relay,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler()))
	if err != nil {
		return err
	}
	defer conn.Close()
	stream, err := Ask(ctx, conn, strings.Join(flags.Args(), " "))
	if err != nil {
		return err
	}
	for {
		event, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return errors.New("the stream ended without a terminal event")
		}
		if err != nil {
			return agio.DecodeError(err)
		}
		fmt.Print(event.GetStepDelta().GetContent())
		if run := agio.TerminalRun(event); run != nil {
			fmt.Printf("\n[%s] run %s\n", run.GetStopSignal().GetReason(), run.GetId())
			return nil
		}
	}
}

// agioAddress is agio-grpc's address when -agio is not given: AGIO_ADDRESS, else the
// server's default listen address.
func agioAddress() string {
	if address := os.Getenv("AGIO_ADDRESS"); address != "" {
		return address
	}
	return "127.0.0.1:50051"
}
