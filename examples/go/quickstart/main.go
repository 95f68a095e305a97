// Command quickstart runs "What is 12 * 7?" to its end, then lists the session's stored steps.
package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	agio "github.com/agio-grpc/agio-grpc/clients/go"
	agiov1 "github.com/agio-grpc/agio-grpc/clients/go/gen/agio/v1"
)

func main() {
	address := os.Getenv("AGIO_ADDRESS")
	if address == "" {
		address = "127.0.0.1:50051"
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	client, err := agio.Dial(address) // plaintext, otelgrpc trace propagation
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	stream, err := client.Run(ctx, &agiov1.RunRequest{Input: "What is 12 * 7?"})
	if err != nil {
		log.Fatal(err)
	}
	result, err := agio.Collect(stream) // or: for event, err := range stream.Events()
	if err != nil {
		log.Fatal(agio.Reason(err), err) // e.g. SESSION_NOT_FOUND
	}
	fmt.Println(result.Text, result.Run.GetStopSignal().GetReason())
	for step, err := range client.ListSteps(ctx, result.Run.GetSessionId(), 0) {
		if err != nil {
			log.Fatal(err)
		}
		var calls []string
		for _, call := range step.GetToolCalls() {
			calls = append(calls, call.GetName()+"("+call.GetArguments()+")")
		}
		text := step.GetContent()
		if text == "" {
			text = strings.Join(calls, ", ")
		}
		fmt.Println(step.GetSequence(), step.GetRole(), text)
	}
}
