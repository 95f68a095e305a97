package agio

import (
	"context"
	"iter"

	agiov1 "github.com/agio-grpc/agio-grpc/clients/go/gen/agio/v1"
)

// GetSession returns a session.
func (c *Client) GetSession(ctx context.Context, sessionID string) (*agiov1.Session, error) {
	resp, err := c.Sessions.GetSession(ctx, &agiov1.GetSessionRequest{SessionId: sessionID})
	if err != nil {
		return nil, DecodeError(err)
	}
	return resp.GetSession(), nil
}

// ListSessions iterates over every session, newest first, following page tokens.
func (c *Client) ListSessions(ctx context.Context, pageSize int32) iter.Seq2[*agiov1.Session, error] {
	return pages(func(token string) ([]*agiov1.Session, string, error) {
		resp, err := c.Sessions.ListSessions(ctx, &agiov1.ListSessionsRequest{PageSize: pageSize, PageToken: token})
		return resp.GetSessions(), resp.GetNextPageToken(), err
	})
}

// DeleteSession deletes a session and its steps; it returns how many steps went.
func (c *Client) DeleteSession(ctx context.Context, sessionID string) (int64, error) {
	resp, err := c.Sessions.DeleteSession(ctx, &agiov1.DeleteSessionRequest{SessionId: sessionID})
	if err != nil {
		return 0, DecodeError(err)
	}
	return resp.GetDeletedSteps(), nil
}

// ListSteps iterates over a session's steps in sequence order, fetching pages of pageSize
// (0: the server's default) and following page tokens to the end.
func (c *Client) ListSteps(ctx context.Context, sessionID string, pageSize int32) iter.Seq2[*agiov1.Step, error] {
	return pages(func(token string) ([]*agiov1.Step, string, error) {
		resp, err := c.Sessions.ListSteps(ctx, &agiov1.ListStepsRequest{SessionId: sessionID, PageSize: pageSize, PageToken: token})
		return resp.GetSteps(), resp.GetNextPageToken(), err
	})
}

// GetStep returns one step of a session.
func (c *Client) GetStep(ctx context.Context, sessionID string, sequence int64) (*agiov1.Step, error) {
	resp, err := c.Sessions.GetStep(ctx, &agiov1.GetStepRequest{SessionId: sessionID, Sequence: sequence})
	if err != nil {
		return nil, DecodeError(err)
	}
	return resp.GetStep(), nil
}

// DeleteSteps deletes a session's steps from startSequence on; it returns how many went.
func (c *Client) DeleteSteps(ctx context.Context, sessionID string, startSequence int64) (int64, error) {
	resp, err := c.Sessions.DeleteSteps(ctx, &agiov1.DeleteStepsRequest{SessionId: sessionID, StartSequence: startSequence})
	if err != nil {
		return 0, DecodeError(err)
	}
	return resp.GetDeletedCount(), nil
}

// ForkSession copies a session's steps up to sequence (0: all) into a new session.
func (c *Client) ForkSession(ctx context.Context, sessionID string, sequence int64) (*agiov1.Session, error) {
	resp, err := c.Sessions.ForkSession(ctx, &agiov1.ForkSessionRequest{SessionId: sessionID, Sequence: sequence})
	if err != nil {
		return nil, DecodeError(err)
	}
	return resp.GetSession(), nil
}

// CompactSession summarizes a session's older steps now, keeping keepRecentSteps after the
// summary (0: the agent's setting); refused while a run holds the session. The response's
// summary is nil when nothing was old enough to summarize.
func (c *Client) CompactSession(ctx context.Context, sessionID string, keepRecentSteps int32, agent string) (*agiov1.CompactSessionResponse, error) {
	resp, err := c.Sessions.CompactSession(ctx, &agiov1.CompactSessionRequest{
		SessionId: sessionID, KeepRecentSteps: keepRecentSteps, Agent: agent,
	})
	if err != nil {
		return nil, DecodeError(err)
	}
	return resp, nil
}

// GetContext returns the messages the model would receive next, and their summary: every
// page, joined (a page token is refused once the session changed: INVALID_ARGUMENT).
func (c *Client) GetContext(ctx context.Context, sessionID, agent string) (*agiov1.GetContextResponse, error) {
	whole := &agiov1.GetContextResponse{}
	token := ""
	for {
		page, err := c.Sessions.GetContext(ctx, &agiov1.GetContextRequest{
			SessionId: sessionID, Agent: agent, PageToken: token,
		})
		if err != nil {
			return nil, DecodeError(err)
		}
		whole.Messages = append(whole.Messages, page.GetMessages()...)
		whole.Summary = page.GetSummary()
		token = page.GetNextPageToken()
		if token == "" {
			return whole, nil
		}
	}
}
