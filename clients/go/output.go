package agio

import (
	"context"
	"encoding/json"
	"fmt"

	"google.golang.org/grpc"

	agiov1 "github.com/agio-grpc/agio-grpc/clients/go/gen/agio/v1"
)

// OutputSchemaJSON is a RunRequest's OutputSchemaJson for schema: a string, []byte or
// json.RawMessage is taken as JSON text as it is; any other value (a map, a struct with
// json tags) is encoded with encoding/json.
func OutputSchemaJSON(schema any) (string, error) {
	switch text := schema.(type) {
	case string:
		return text, nil
	case []byte:
		return string(text), nil
	case json.RawMessage:
		return string(text), nil
	}
	encoded, err := json.Marshal(schema)
	if err != nil {
		return "", fmt.Errorf("agio: the output schema is not JSON: %w", err)
	}
	return string(encoded), nil
}

// Output is a run's structured answer as a JSON value (map[string]any, []any, float64,
// string, bool or nil), and whether the run has one: a run with an output schema that
// completed has; one that ended otherwise (STOP_REASON_OUTPUT_INVALID, a limit) has not,
// and its stop signal says why.
func Output(run *agiov1.Run) (any, bool) {
	if run.GetOutput() == nil {
		return nil, false
	}
	return run.GetOutput().AsInterface(), true
}

// DecodeOutput decodes a run's structured answer into v (a pointer, as for
// json.Unmarshal); an error when the run has none.
func DecodeOutput(run *agiov1.Run, v any) error {
	value, ok := Output(run)
	if !ok {
		return fmt.Errorf("agio: run %s has no output (stop reason %s)", run.GetId(), run.GetStopSignal().GetReason())
	}
	encoded, err := json.Marshal(value)
	if err != nil {
		return err
	}
	return json.Unmarshal(encoded, v)
}

// RunForOutput runs req with schema as its output schema (see OutputSchemaJSON; it replaces
// the agent's) to its end, and returns the collected result and the run's answer as a
// JSON value (nil when the run ended without one: see Output).
func (c *Client) RunForOutput(ctx context.Context, req *agiov1.RunRequest, schema any, opts ...grpc.CallOption) (*RunResult, any, error) {
	text, err := OutputSchemaJSON(schema)
	if err != nil {
		return nil, nil, err
	}
	req.OutputSchemaJson = text
	stream, err := c.Run(ctx, req, opts...)
	if err != nil {
		return nil, nil, err
	}
	result, err := Collect(stream)
	if err != nil {
		return nil, nil, err
	}
	value, _ := Output(result.Run)
	return result, value, nil
}
