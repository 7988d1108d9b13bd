package baton

import (
	"context"
	"errors"
	"time"

	"github.com/baton-dev/baton/clients/go/internal/pb"
)

// ID is the session's id: a secret, it resumes the session.
func (s *Session) ID() []byte { return s.id }

// TTL is the session's TTL.
func (s *Session) TTL() time.Duration { return s.ttl }

// SafeUntil is where the session, and every lease tied to it, stops being
// certainly held (monotonic): the last acknowledged heartbeat's send time
// plus the TTL, minus the margin.
func (s *Session) SafeUntil() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.safeUntil
}

// Resumes is how many times the stream broke and the session was resumed.
func (s *Session) Resumes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.resumes
}

// Done is closed once the session has ended; [Session.Err] says why.
func (s *Session) Done() <-chan struct{} { return s.ended }

// Ended says whether the session has ended.
func (s *Session) Ended() bool {
	select {
	case <-s.ended:
		return true
	default:
		return false
	}
}

// Err is why the session ended, nil while it lives.
func (s *Session) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.why
}

// RevokedToken is the token of this session's lease on resource that a
// fence revoked, as a heartbeat reported it (0 if none).
func (s *Session) RevokedToken(resource string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.revoked[resource]
}

// Acquire takes resource on this session: tied to it (it lives while the
// session does) unless [WithTTL] gives it a TTL of its own. Cancelling
// ctx while it waits withdraws the wait on the server.
func (s *Session) Acquire(ctx context.Context, resource string, options ...AcquireOption) (*Lease, error) {
	leases, err := s.AcquireAll(ctx, []string{resource}, options...)
	if err != nil {
		return nil, err
	}
	return leases[0], nil
}

// AcquireAll takes every resource or none on this session.
func (s *Session) AcquireAll(ctx context.Context, resources []string, options ...AcquireOption) ([]*Lease, error) {
	var a acquireSettings
	for _, o := range options {
		o(&a)
	}
	holder := s.holder
	if a.holder != nil {
		holder = *a.holder
	}
	unary, err := s.client.acquireRequest(resources, a, holder)
	if err != nil {
		return nil, err
	}
	acquire := &pb.SessionAcquire{
		Resources: unary.Resources, TtlMs: unary.TtlMs, WaitMs: unary.WaitMs,
		Holder: unary.Holder, RequestId: unary.RequestId, Shapes: unary.Shapes,
	}
	// A lease answered to a repeat counts from the first send too.
	sent := time.Now()
	budget := sent.Add(s.client.timeout + a.wait)
	for {
		resumes := s.Resumes()
		r, err := s.request(ctx, func(id uint64) *pb.SessionRequest {
			return &pb.SessionRequest{Id: id, Op: &pb.SessionRequest_Acquire{Acquire: acquire}}
		}, max(time.Until(budget), time.Millisecond), acquire.WaitMs > 0)
		if errors.Is(err, ErrIndeterminate) && s.resumedSince(ctx, resumes, budget) {
			// The stream broke with the answer in flight: the same request
			// again on the resumed session, marked as a repeat.
			since := max(1, uint64(time.Since(sent).Milliseconds()))
			acquire.FirstSentMsAgo = &since
			acquire.WaitMs = unary.WaitMs - min(unary.WaitMs, since)
			continue
		}
		if err != nil {
			return nil, err
		}
		leases, err := granted(r.GetAcquire(), sent, len(resources))
		if err != nil {
			return nil, err
		}
		if a.ttl == 0 {
			// Tied to the session: held while it is.
			for _, l := range leases {
				l.SessionBound = true
				if safe := s.SafeUntil().Add(s.margin); safe.After(l.ValidUntil) {
					l.ValidUntil = safe
				}
			}
		}
		return leases, nil
	}
}

// resumedSince waits until the session was resumed after resumes
// resumptions (true), or it ended, ctx ended or until passed (false).
func (s *Session) resumedSince(ctx context.Context, resumes int, until time.Time) bool {
	for time.Now().Before(until) {
		s.mu.Lock()
		now, next := s.resumes, s.resumed
		s.mu.Unlock()
		if now > resumes {
			return true
		}
		timer := time.NewTimer(time.Until(until))
		select {
		case <-next:
		case <-s.ended:
			timer.Stop()
			return false
		case <-ctx.Done():
			timer.Stop()
			return false
		case <-timer.C:
			return false
		}
		timer.Stop()
	}
	return false
}

// Release gives a lease back (tied to the session or not); false if it
// was not held.
func (s *Session) Release(ctx context.Context, lease *Lease) (bool, error) {
	release := &pb.ReleaseRequest{Resource: lease.Resource, AcquisitionId: lease.AcquisitionID}
	r, err := s.request(ctx, func(id uint64) *pb.SessionRequest {
		return &pb.SessionRequest{Id: id, Op: &pb.SessionRequest_Release{Release: release}}
	}, s.client.timeout, false)
	if err != nil {
		return false, err
	}
	return r.GetRelease().GetReleased(), nil
}

// Close ends the session, releasing the leases tied to it and withdrawing
// its waiters (a lease acquired on it with a TTL of its own lives on until
// that TTL); false if it had already ended.
func (s *Session) Close(ctx context.Context) (bool, error) {
	if s.Ended() {
		return false, nil
	}
	r, err := s.request(ctx, func(id uint64) *pb.SessionRequest {
		return &pb.SessionRequest{Id: id, Op: &pb.SessionRequest_Close{Close: &pb.CloseSession{}}}
	}, s.client.timeout, false)
	s.mu.Lock()
	s.closing = true
	s.mu.Unlock()
	s.end(errorf(ErrSessionEnded, "the session was closed"))
	if errors.Is(err, ErrSessionEnded) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return r.GetClosed().GetWasOpen(), nil
}
