package baton

import (
	"context"
	"errors"
	"time"
)

// Election is one fenced election: a resource name whose holder is the
// leader. Candidates wait in line, first come first served, on a session
// whose holder description is their value; the leader's token is above
// every earlier leader's.
type Election struct {
	client *Client
	name   string
}

// Leader is the leader as others see it.
type Leader struct {
	Token uint64
	Value string
}

// Election is the election named name (a resource name).
func (c *Client) Election(name string) (*Election, error) {
	canonical, err := CheckResource(name, false)
	if err != nil {
		return nil, err
	}
	return &Election{client: c, name: canonical}, nil
}

// Campaign waits in line on a new session (TTL ttl, 0: the server's
// default) whose holder is value until this candidate leads, and returns
// the kept leadership: its Token, its Context (cancelled when leadership
// is lost or uncertain); resign with its Release or by closing its
// Session. Until ctx is done: then the wait is withdrawn and the session
// closed.
func (e *Election) Campaign(ctx context.Context, value string, ttl time.Duration) (*SessionKeeper, error) {
	if _, err := CheckHolder(value); err != nil {
		return nil, err
	}
	session, err := e.client.OpenSession(ctx, ttl, SessionHolder(value))
	if err != nil {
		return nil, err
	}
	lease, err := e.waitInLine(ctx, session)
	if err != nil {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.client.timeout)
		defer cancel()
		_, _ = session.Close(closeCtx)
		return nil, err
	}
	return session.Keep(context.WithoutCancel(ctx), lease), nil
}

// Leader is the current leader, nil if there is none.
func (e *Election) Leader(ctx context.Context) (*Leader, error) {
	st, err := e.client.Status(ctx, e.name)
	if err != nil || st.HolderToken == 0 {
		return nil, err
	}
	return &Leader{Token: st.HolderToken, Value: st.Holder}, nil
}

// Observe calls f with the leader now (a nil change), then with each
// change of leader: a grant or hand-off names the new leader, a release,
// expiry or fence leaves none (nil). The watch resumes by itself across
// a restart or a failover; after a new snapshot ("resnapshot") f gets
// the leader found there, if it is another. It returns when f returns
// false (nil), ctx ends, or the watch fails for good (with [WatchOnce]:
// at a restart or failover, [ErrWatchEnded]).
func (e *Election) Observe(ctx context.Context, f func(change *Change, leader *Leader) bool, options ...WatchOption) error {
	w, err := e.client.Watch(ctx, e.name, options...)
	if err != nil {
		return err
	}
	defer w.Close()
	now := e.leaderIn(w.Holders)
	if !f(nil, now) {
		return nil
	}
	for {
		change, err := w.Next()
		if err != nil {
			if ctx.Err() != nil {
				return errors.Join(ctx.Err(), err)
			}
			return err
		}
		if change.Resnapshot != nil {
			found := e.leaderIn(change.Resnapshot.Holders)
			if (found == nil) == (now == nil) && (found == nil || *found == *now) {
				continue
			}
			now = found
			if !f(&change, now) {
				return nil
			}
			continue
		}
		if change.Resource != e.name {
			continue
		}
		var leader *Leader
		if change.Kind == "granted" || change.Kind == "handed_off" {
			leader = &Leader{Token: change.Token, Value: change.Holder}
		}
		now = leader
		if !f(&change, leader) {
			return nil
		}
	}
}

// leaderIn is the leader among a snapshot's holders (nil: none).
func (e *Election) leaderIn(holders []Holder) *Leader {
	for _, h := range holders {
		if h.Resource == e.name {
			return &Leader{Token: h.Token, Value: h.Holder}
		}
	}
	return nil
}

// campaignChunk is the longest single wait of a campaign: servers cap a
// wait (at 10 minutes by default), so a campaign without a deadline waits
// in chunks on its session, keeping its place while the session lives.
const campaignChunk = time.Minute

// waitInLine acquires the election's name on session, waiting until ctx
// is done.
func (e *Election) waitInLine(ctx context.Context, session *Session) (*Lease, error) {
	for {
		wait := campaignChunk
		deadline, bounded := ctx.Deadline()
		if bounded {
			wait = min(wait, time.Until(deadline).Truncate(time.Millisecond))
		}
		lease, err := session.Acquire(ctx, e.name, WithWait(max(wait, time.Millisecond)))
		var na *NotAcquiredError
		if errors.As(err, &na) && na.Reason == "timed out" && ctx.Err() == nil && (!bounded || time.Now().Before(deadline)) {
			continue
		}
		return lease, err
	}
}
