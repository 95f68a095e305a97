// Command agio-chat streams one agent run: the reply as it is generated, tool calls and
// their results, then the stop reason and usage.
//
//	go run ./cmd/agio-chat -address 127.0.0.1:50051 "What is 12 * 7?"
//
// -address defaults to the AGIO_ADDRESS environment variable, else 127.0.0.1:50051. A server
// that wants them gets a token (-token, else AGIO_TOKEN) as `authorization: Bearer`, and TLS:
// -ca-file (AGIO_CA_FILE), or -tls for the system's roots; mutual TLS adds -cert-file and
// -key-file (AGIO_CERT_FILE, AGIO_KEY_FILE).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc"

	agio "github.com/agio-grpc/agio-grpc/clients/go"
	agiov1 "github.com/agio-grpc/agio-grpc/clients/go/gen/agio/v1"
)

const defaultAddress = "127.0.0.1:50051"

func main() {
	address := flag.String("address", serverAddress(), "agio-grpc server host:port, several separated by commas, or dns:///host:port (AGIO_ADDRESS, else "+defaultAddress+")")
	session := flag.String("session", "", "continue this session (empty: a new one)")
	agent := flag.String("agent", "", "agent name (empty: the default agent)")
	timeout := flag.Duration("timeout", 5*time.Minute, "deadline of the whole run")
	var conn connection
	// The token's default is read after parsing, so that -help never shows it.
	flag.StringVar(&conn.token, "token", "", "credential sent as `authorization: Bearer TOKEN` (default: AGIO_TOKEN)")
	flag.BoolVar(&conn.tls, "tls", false, "use TLS, trusting the system's roots (implied by -ca-file and -cert-file)")
	flag.StringVar(&conn.files.CAFile, "ca-file", os.Getenv("AGIO_CA_FILE"), "use TLS, trusting the CAs in this PEM file (AGIO_CA_FILE)")
	flag.StringVar(&conn.files.CertFile, "cert-file", os.Getenv("AGIO_CERT_FILE"), "mutual TLS: this client's PEM certificate (AGIO_CERT_FILE)")
	flag.StringVar(&conn.files.KeyFile, "key-file", os.Getenv("AGIO_KEY_FILE"), "mutual TLS: the key of -cert-file (AGIO_KEY_FILE)")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: agio-chat [flags] MESSAGE")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if conn.token == "" {
		conn.token = os.Getenv("AGIO_TOKEN")
	}
	opts, err := conn.dialOptions()
	if err != nil {
		fmt.Fprintln(os.Stderr, "agio-chat:", err)
		os.Exit(2)
	}
	if err := chat(*address, opts, *session, *agent, strings.Join(flag.Args(), " "), *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "agio-chat:", err)
		os.Exit(1)
	}
}

// connection is how to reach the server beyond its address: a token and TLS.
type connection struct {
	token string
	tls   bool
	files agio.TLSConfig
}

// dialOptions are the options of agio.Dial: TLS when -tls or a file is given, the token
// when there is one.
func (c connection) dialOptions() ([]grpc.DialOption, error) {
	var opts []grpc.DialOption
	if c.tls || c.files != (agio.TLSConfig{}) {
		creds, err := c.files.Credentials()
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.WithTransportCredentials(creds))
	}
	if c.token != "" {
		opts = append(opts, agio.WithToken(c.token))
	}
	return opts, nil
}

// serverAddress is the address to use when -address is not given: AGIO_ADDRESS, as every
// agio-grpc command line reads it, else the server's default listen address.
func serverAddress() string {
	if address := os.Getenv("AGIO_ADDRESS"); address != "" {
		return address
	}
	return defaultAddress
}

func chat(address string, opts []grpc.DialOption, session, agent, input string, timeout time.Duration) error {
	// W3C trace context, so a trace the caller is in continues on the server.
	otel.SetTextMapPropagator(propagation.TraceContext{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	client, err := agio.Dial(address, opts...)
	if err != nil {
		return err
	}
	defer client.Close()
	stream, err := client.Run(ctx, &agiov1.RunRequest{SessionId: session, Agent: agent, Input: input})
	if err != nil {
		return err
	}
	for event, err := range stream.Events() {
		if err != nil {
			return err
		}
		if delta := event.GetStepDelta(); delta != nil {
			fmt.Print(delta.GetContent())
		}
		if step := event.GetStepCompleted().GetStep(); step != nil {
			printStep(step)
		}
		if progress := event.GetToolProgress(); progress != nil {
			said := ""
			if progress.GetMessage() != "" {
				said = ": " + progress.GetMessage()
			}
			fmt.Fprintf(os.Stderr, "  .. %s %s%s\n", progress.GetName(), progress.GetState(), said)
		}
		if run := agio.TerminalRun(event); run != nil {
			signal, usage := run.GetStopSignal(), run.GetUsage()
			fmt.Printf("\n[%s] %s | tokens in %d out %d | steps %d | session %s\n",
				strings.TrimPrefix(signal.GetReason().String(), "STOP_REASON_"), signal.GetMessage(),
				usage.GetInputTokens(), usage.GetOutputTokens(), run.GetStepCount(), run.GetSessionId())
			return nil
		}
	}
	return fmt.Errorf("the run stream ended without a terminal event")
}

func printStep(step *agiov1.Step) {
	for _, call := range step.GetToolCalls() {
		fmt.Printf("\n-> %s(%s)\n", call.GetName(), call.GetArguments())
	}
	if step.GetRole() == agiov1.Role_ROLE_TOOL {
		fmt.Printf("<- %s\n", step.GetContent())
	}
}
