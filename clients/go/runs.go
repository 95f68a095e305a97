package agio

import (
	"context"
	"iter"

	"google.golang.org/grpc"

	agiov1 "github.com/agio-grpc/agio-grpc/clients/go/gen/agio/v1"
)

// Run starts a run and returns its event stream.
func (c *Client) Run(ctx context.Context, req *agiov1.RunRequest, opts ...grpc.CallOption) (*RunStream, error) {
	return runStream(c.Agents.Run(ctx, req, opts...))
}

// SubmitToolOutputs continues a REQUIRES_ACTION run with the client tools' outputs.
func (c *Client) SubmitToolOutputs(ctx context.Context, runID string, outputs []*agiov1.ToolOutput, opts ...grpc.CallOption) (*RunStream, error) {
	req := &agiov1.SubmitToolOutputsRequest{RunId: runID, ToolOutputs: outputs}
	return runStream(c.Agents.SubmitToolOutputs(ctx, req, opts...))
}

// Retry deletes a session's steps from sequence on and regenerates.
func (c *Client) Retry(ctx context.Context, sessionID string, sequence int64, opts ...grpc.CallOption) (*RunStream, error) {
	req := &agiov1.RetryRequest{SessionId: sessionID, Sequence: sequence}
	return runStream(c.Agents.Retry(ctx, req, opts...))
}

// WatchRun replays a run's events after afterSeq, then follows it live.
func (c *Client) WatchRun(ctx context.Context, runID string, afterSeq int64, opts ...grpc.CallOption) (*RunStream, error) {
	req := &agiov1.WatchRunRequest{RunId: runID, AfterSeq: afterSeq}
	return runStream(c.Agents.WatchRun(ctx, req, opts...))
}

// CancelRun asks the server to stop a run; the run's stream then ends with CANCELLED.
func (c *Client) CancelRun(ctx context.Context, runID, reason string) (*agiov1.Run, error) {
	resp, err := c.Agents.CancelRun(ctx, &agiov1.CancelRunRequest{RunId: runID, Reason: reason})
	if err != nil {
		return nil, DecodeError(err)
	}
	return resp.GetRun(), nil
}

// GetRun returns a run's stored record.
func (c *Client) GetRun(ctx context.Context, runID string) (*agiov1.Run, error) {
	resp, err := c.Agents.GetRun(ctx, &agiov1.GetRunRequest{RunId: runID})
	if err != nil {
		return nil, DecodeError(err)
	}
	return resp.GetRun(), nil
}

// ListRuns iterates over a session's runs, newest first, following page tokens.
func (c *Client) ListRuns(ctx context.Context, sessionID string, pageSize int32) iter.Seq2[*agiov1.Run, error] {
	return pages(func(token string) ([]*agiov1.Run, string, error) {
		resp, err := c.Agents.ListRuns(ctx, &agiov1.ListRunsRequest{SessionId: sessionID, PageSize: pageSize, PageToken: token})
		return resp.GetRuns(), resp.GetNextPageToken(), err
	})
}

// ListAgents returns the configured agents.
func (c *Client) ListAgents(ctx context.Context) ([]*agiov1.Agent, error) {
	resp, err := c.Agents.ListAgents(ctx, &agiov1.ListAgentsRequest{})
	if err != nil {
		return nil, DecodeError(err)
	}
	return resp.GetAgents(), nil
}
