package agio

import (
	"context"
	"errors"
	"iter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	agiov1 "github.com/agio-grpc/agio-grpc/clients/go/gen/agio/v1"
)

// Run starts a run and returns its event stream.
func (c *Client) Run(ctx context.Context, req *agiov1.RunRequest, opts ...grpc.CallOption) (*RunStream, error) {
	return runStream(c.Agents.Run(ctx, req, opts...))
}

// StartRun starts a run in the background and returns it at once (RUNNING, or QUEUED behind
// a busy session, by req.OnBusy); follow it with FollowRun, stop it with CancelRun.
func (c *Client) StartRun(ctx context.Context, req *agiov1.RunRequest, opts ...grpc.CallOption) (*agiov1.Run, error) {
	resp, err := c.Agents.StartRun(ctx, req, opts...)
	if err != nil {
		return nil, DecodeError(err)
	}
	return resp.GetRun(), nil
}

// FollowRun iterates over a run's events after afterSeq to its terminal event, replayed then
// live. When the stream breaks with UNAVAILABLE (a server restarting) it watches again from
// the last seq it yielded, up to reconnects times in a row, backing off from 200 ms. With
// afterSeq at the terminal event's seq the server's stream is empty (status OK): the
// iteration ends at once, with no event.
func (c *Client) FollowRun(ctx context.Context, runID string, afterSeq int64, reconnects int) iter.Seq2[*agiov1.StepEvent, error] {
	return func(yield func(*agiov1.StepEvent, error) bool) {
		cursor, failures := afterSeq, 0
		for {
			err := c.followOnce(ctx, runID, &cursor, &failures, yield)
			if err == nil {
				return
			}
			var decoded *Error
			if !errors.As(err, &decoded) || decoded.Code != codes.Unavailable || failures >= reconnects {
				yield(nil, err)
				return
			}
			select {
			case <-ctx.Done():
				yield(nil, ctx.Err())
				return
			case <-time.After(min(200*time.Millisecond<<failures, 5*time.Second)):
			}
			failures++
		}
	}
}

func (c *Client) followOnce(ctx context.Context, runID string, cursor *int64, failures *int, yield func(*agiov1.StepEvent, error) bool) error {
	stream, err := c.WatchRun(ctx, runID, *cursor)
	if err != nil {
		return err
	}
	for event, err := range stream.Events() {
		if err != nil {
			return err
		}
		*cursor, *failures = event.GetSeq(), 0
		if !yield(event, nil) || TerminalRun(event) != nil {
			return nil
		}
	}
	return nil
}

// SubmitToolOutputs continues a REQUIRES_ACTION run with the client tools' outputs.
func (c *Client) SubmitToolOutputs(ctx context.Context, runID string, outputs []*agiov1.ToolOutput, opts ...grpc.CallOption) (*RunStream, error) {
	req := &agiov1.SubmitToolOutputsRequest{RunId: runID, ToolOutputs: outputs}
	return runStream(c.Agents.SubmitToolOutputs(ctx, req, opts...))
}

// SubmitAnswers continues a REQUIRES_ACTION run with everything its RequiredAction waits
// for at once: an output per client tool call and a decision per call waiting for approval
// (anything left out is INVALID_ARGUMENT, naming the ids, and changes nothing).
func (c *Client) SubmitAnswers(ctx context.Context, runID string, outputs []*agiov1.ToolOutput, approvals []*agiov1.ToolApproval, opts ...grpc.CallOption) (*RunStream, error) {
	req := &agiov1.SubmitToolOutputsRequest{RunId: runID, ToolOutputs: outputs, Approvals: approvals}
	return runStream(c.Agents.SubmitToolOutputs(ctx, req, opts...))
}

// Approve approves calls of a run waiting for approval (every call it waits for when
// callIDs is empty) and returns the continued run's stream.
func (c *Client) Approve(ctx context.Context, runID string, callIDs []string, reason string, opts ...grpc.CallOption) (*RunStream, error) {
	return c.decide(ctx, runID, callIDs, true, reason, opts)
}

// Reject rejects calls of a run waiting for approval (every one when callIDs is empty): the
// model sees each was rejected, and reason. Returns the continued run's stream.
func (c *Client) Reject(ctx context.Context, runID string, callIDs []string, reason string, opts ...grpc.CallOption) (*RunStream, error) {
	return c.decide(ctx, runID, callIDs, false, reason, opts)
}

func (c *Client) decide(ctx context.Context, runID string, callIDs []string, approved bool, reason string, opts []grpc.CallOption) (*RunStream, error) {
	if len(callIDs) == 0 {
		run, err := c.GetRun(ctx, runID)
		if err != nil {
			return nil, err
		}
		for _, call := range run.GetRequiredAction().GetApprovals() {
			callIDs = append(callIDs, call.GetId())
		}
	}
	approvals := make([]*agiov1.ToolApproval, 0, len(callIDs))
	for _, id := range callIDs {
		approvals = append(approvals, &agiov1.ToolApproval{ToolCallId: id, Approved: approved, Reason: reason})
	}
	return c.SubmitAnswers(ctx, runID, nil, approvals, opts...)
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
