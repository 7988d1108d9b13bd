package baton

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/baton-dev/baton/clients/go/internal/pb"
)

// read dispatches stream's answers until it breaks, then resumes.
func (s *Session) read(stream pb.Leases_SessionClient) {
	for {
		r, err := stream.Recv()
		if err != nil {
			s.broke(stream, err)
			return
		}
		id := r.GetId()
		s.mu.Lock()
		if id >= heartbeatIDBit {
			if sent, ok := s.heartbeats[id]; ok {
				delete(s.heartbeats, id)
				if ack := r.GetHeartbeat(); ack != nil {
					until := sent.Add(time.Duration(ack.GetRemainingMs())*time.Millisecond - s.margin)
					if until.After(s.safeUntil) {
						s.safeUntil = until
					}
					s.noteRevokedLocked(ack.GetRevoked())
				}
			}
			s.mu.Unlock()
			if r.GetEnded() != nil {
				s.end(errorf(ErrSessionEnded, notOpen))
			}
			continue
		}
		ch := s.pending[id]
		delete(s.pending, id)
		s.mu.Unlock()
		var a answer
		_, ended := r.GetBody().(*pb.SessionResponse_Ended)
		switch body := r.GetBody().(type) {
		case *pb.SessionResponse_Error:
			a.err = requestError(body.Error)
		case *pb.SessionResponse_Ended:
			a.err = errorf(ErrSessionEnded, notOpen)
		default:
			a.response = r
		}
		if ch != nil {
			ch <- a
		}
		if ended {
			s.end(a.err)
		}
	}
}

func (s *Session) noteRevokedLocked(revoked []*pb.RevokedLease) {
	for _, r := range revoked {
		s.revoked[r.GetResource()] = r.GetToken()
	}
}

// broke handles the end of stream: nothing more after a close or an end,
// the session ended on a refused heartbeat, else a resume.
func (s *Session) broke(stream pb.Leases_SessionClient, err error) {
	s.mu.Lock()
	current := s.stream == stream
	closing := s.closing
	s.mu.Unlock()
	if !current || closing || s.Ended() {
		return
	}
	if status.Code(err) == codes.PermissionDenied {
		s.end(errorf(ErrPermissionDenied, "%s", status.Convert(err).Message()))
		return
	}
	s.resume()
}

// resume fails the requests in flight as indeterminate, then opens the
// session again on the leader while its safe-until lasts.
func (s *Session) resume() {
	s.mu.Lock()
	pending := s.pending
	s.pending = map[uint64]chan answer{}
	s.heartbeats = map[uint64]time.Time{}
	s.mu.Unlock()
	for _, ch := range pending {
		ch <- answer{err: errorf(ErrIndeterminate, "the session stream broke before an answer came; the request may have taken effect")}
	}
	pause := 20 * time.Millisecond
	for !s.Ended() && time.Now().Before(s.SafeUntil()) {
		ctx, cancel := context.WithDeadline(context.Background(), s.SafeUntil())
		stream, streamCancel, opened, err := s.client.openStream(ctx, &pb.OpenSession{Resume: s.id})
		cancel()
		if err == nil {
			s.mu.Lock()
			old := s.cancel
			s.stream, s.cancel = stream, streamCancel
			s.noteRevokedLocked(opened.GetRevoked())
			s.resumes++
			close(s.resumed)
			s.resumed = make(chan struct{})
			s.mu.Unlock()
			old()
			go s.read(stream)
			return
		}
		if errors.Is(err, ErrSessionEnded) || errors.Is(err, ErrPermissionDenied) {
			s.end(err)
			return
		}
		time.Sleep(pause)
		pause = min(pause*2, 500*time.Millisecond)
	}
	s.end(errorf(ErrSessionEnded, "the session could not be resumed before its safe-until"))
}

// beat sends a heartbeat every third of the TTL; the session ends on
// this clock at its safe-until if none was acknowledged in time.
func (s *Session) beat() {
	ticker := time.NewTicker(s.ttl / 3)
	defer ticker.Stop()
	for {
		select {
		case <-s.ended:
			return
		case <-ticker.C:
		}
		if !time.Now().Before(s.SafeUntil()) {
			s.end(errorf(ErrSessionEnded, "no heartbeat was acknowledged before the session's safe-until"))
			return
		}
		s.mu.Lock()
		id := s.nextBeat
		s.nextBeat++
		s.heartbeats[id] = time.Now()
		s.mu.Unlock()
		_ = s.send(&pb.SessionRequest{Id: id, Op: &pb.SessionRequest_Heartbeat{Heartbeat: &pb.Heartbeat{}}})
	}
}

// send writes one request on the current stream.
func (s *Session) send(r *pb.SessionRequest) error {
	s.mu.Lock()
	stream := s.stream
	s.mu.Unlock()
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return stream.Send(r)
}

// end ends the session with why (the first reason stays).
func (s *Session) end(why error) {
	s.mu.Lock()
	if s.why != nil {
		s.mu.Unlock()
		return
	}
	s.why = why
	close(s.ended)
	pending := s.pending
	s.pending = map[uint64]chan answer{}
	cancel := s.cancel
	s.mu.Unlock()
	for _, ch := range pending {
		ch <- answer{err: why}
	}
	if cancel != nil {
		cancel()
	}
}

// answers and timers are reused across a session's requests (two of
// each a lease's cycle, otherwise a fifth of what the client allocates).
// An answer channel goes back only once its answer was read, and a timer
// once stopped (since Go 1.23 a stopped timer's channel holds nothing).
var (
	answers = sync.Pool{New: func() any { return make(chan answer, 1) }}
	timers  = sync.Pool{New: func() any {
		t := time.NewTimer(time.Hour)
		t.Stop()
		return t
	}}
)

// request sends op and waits for its answer (or timeout). waits: a
// waiting acquire, withdrawn on the server if ctx ends first.
func (s *Session) request(ctx context.Context, op func(id uint64) *pb.SessionRequest, timeout time.Duration, waits bool) (*pb.SessionResponse, error) {
	s.mu.Lock()
	if s.why != nil {
		s.mu.Unlock()
		return nil, s.why
	}
	id := s.nextID
	s.nextID++
	ch := answers.Get().(chan answer)
	s.pending[id] = ch
	s.mu.Unlock()
	forget := func() {
		s.mu.Lock()
		delete(s.pending, id)
		s.mu.Unlock()
	}
	// A send on a broken stream fails here and in the reader, which fails
	// ch as indeterminate when it resumes or ends the session.
	_ = s.send(op(id))
	timer := timers.Get().(*time.Timer)
	timer.Reset(timeout)
	defer func() {
		timer.Stop()
		timers.Put(timer)
	}()
	select {
	case a := <-ch:
		// Whoever sent a took ch out of pending first: no one else will.
		answers.Put(ch)
		return a.response, a.err
	case <-timer.C:
		forget()
		return nil, errorf(ErrIndeterminate, "no answer on the session within %d ms; the request may have taken effect", timeout.Milliseconds())
	case <-ctx.Done():
		if !waits {
			forget()
			return nil, errorf(ErrIndeterminate, "cancelled before the answer came; the request may have taken effect: %v", ctx.Err())
		}
		return s.withdraw(id, ch, ctx.Err())
	}
}

// withdraw cancels waiting acquire id, reads its answer, and gives back a
// grant that came first (no one will hold it).
func (s *Session) withdraw(id uint64, ch chan answer, cause error) (*pb.SessionResponse, error) {
	s.mu.Lock()
	cancelID := s.nextID
	s.nextID++
	s.mu.Unlock()
	_ = s.send(&pb.SessionRequest{Id: cancelID, Op: &pb.SessionRequest_Cancel{Cancel: &pb.CancelWait{AcquireId: id}}})
	timer := time.NewTimer(s.client.timeout)
	defer timer.Stop()
	select {
	case a := <-ch:
		if g := a.response.GetAcquire().GetGranted(); g != nil {
			for _, l := range g.GetLeases() {
				release := &pb.ReleaseRequest{Resource: l.GetResource(), AcquisitionId: l.GetAcquisitionId()}
				_, _ = s.request(context.Background(), func(id uint64) *pb.SessionRequest {
					return &pb.SessionRequest{Id: id, Op: &pb.SessionRequest_Release{Release: release}}
				}, s.client.timeout, false)
			}
		}
	case <-timer.C:
	}
	return nil, &NotAcquiredError{Reason: "cancelled: " + cause.Error()}
}
