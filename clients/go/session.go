package baton

import (
	"context"
	"errors"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/baton-dev/baton/clients/go/internal/pb"
)

// ErrSessionEnded: the session is over (it expired, was closed, or its
// safe-until passed without a resume); every lease tied to it has ended.
var ErrSessionEnded = errors.New("session ended")

// heartbeatIDBit marks the ids of a session's own heartbeats; callers'
// requests count up from 1.
const heartbeatIDBit = uint64(1) << 63

const notOpen = "the session is not open (it expired or was closed)"

// Session is one stream to the leader that many leases share: a
// heartbeat every third of its TTL keeps it, and every lease tied to it,
// alive. Its safe-until is the send time of the last acknowledged
// heartbeat plus the TTL, minus the margin, on this process's monotonic
// clock. When the stream breaks, requests in flight fail as
// [ErrIndeterminate] (an acquire is sent again under its request id once
// the session is resumed) and the session is resumed on the leader while
// its safe-until lasts. Safe for concurrent use.
type Session struct {
	client *Client
	holder string
	id     []byte
	ttl    time.Duration
	margin time.Duration

	mu         sync.Mutex
	stream     pb.Leases_SessionClient
	cancel     context.CancelFunc
	pending    map[uint64]chan answer
	heartbeats map[uint64]time.Time
	safeUntil  time.Time
	revoked    map[string]uint64
	resumes    int
	resumed    chan struct{} // closed at the next resume, then replaced
	why        error
	ended      chan struct{}
	closing    bool
	nextID     uint64
	nextBeat   uint64

	sendMu sync.Mutex // one message at a time on a gRPC stream
}

type answer struct {
	response *pb.SessionResponse
	err      error
}

// SessionOption sets one option of [Client.OpenSession].
type SessionOption func(*Session)

// SessionHolder describes who holds the leases acquired on the session
// (instead of the client's holder): an election's candidate value.
func SessionHolder(holder string) SessionOption {
	return func(s *Session) { s.holder = holder }
}

// OpenSession opens a session with this TTL (0: the server's default).
func (c *Client) OpenSession(ctx context.Context, ttl time.Duration, options ...SessionOption) (*Session, error) {
	open := &pb.OpenSession{}
	if ttl != 0 {
		ms, err := millis(ttl, "session ttl", false)
		if err != nil {
			return nil, err
		}
		open.TtlMs = &ms
	}
	s := &Session{
		client: c, pending: map[uint64]chan answer{}, heartbeats: map[uint64]time.Time{},
		revoked: map[string]uint64{}, resumed: make(chan struct{}), ended: make(chan struct{}),
		nextID: 1, nextBeat: heartbeatIDBit, holder: c.holder,
	}
	for _, o := range options {
		o(s)
	}
	if s.holder != "" {
		if _, err := CheckHolder(s.holder); err != nil {
			return nil, err
		}
	}
	sent := time.Now()
	stream, cancel, opened, err := c.openStream(ctx, open)
	if err != nil {
		return nil, err
	}
	s.id = opened.GetSessionId()
	s.ttl = time.Duration(opened.GetTtlMs()) * time.Millisecond
	s.margin = MarginOf(s.ttl)
	s.safeUntil = sent.Add(s.ttl - s.margin)
	s.stream, s.cancel = stream, cancel
	go s.read(stream)
	go s.beat()
	return s, nil
}

// openStream opens a Session stream on the leader with open as its first
// request: the stream, its cancel, and the server's answer.
func (c *Client) openStream(ctx context.Context, open *pb.OpenSession) (pb.Leases_SessionClient, context.CancelFunc, *pb.SessionOpened, error) {
	var stream pb.Leases_SessionClient
	var opened *pb.SessionOpened
	// The stream outlives the call that opened it.
	cancel, addr, _, err := c.streamOnLeader(ctx, context.WithoutCancel(ctx),
		func(streamCtx context.Context, conn *grpc.ClientConn) (metadata.MD, error) {
			var err error
			opened, stream, err = c.tryOpen(ctx, streamCtx, conn, open)
			if err != nil && stream != nil {
				return stream.Trailer(), err
			}
			return nil, err
		})
	if err == nil {
		return stream, cancel, opened, nil
	}
	var ours *Error
	if errors.As(err, &ours) {
		return nil, nil, nil, err
	}
	return nil, nil, nil, mapError(err, addr, c.timeout)
}

// tryOpen sends open on a new stream and reads the answer, within the
// call's timeout (the stream itself lives on under streamCtx).
func (c *Client) tryOpen(ctx, streamCtx context.Context, conn *grpc.ClientConn, open *pb.OpenSession) (*pb.SessionOpened, pb.Leases_SessionClient, error) {
	stream, err := pb.NewLeasesClient(conn).Session(streamCtx)
	if err != nil {
		return nil, nil, err
	}
	if err := stream.Send(&pb.SessionRequest{Id: 0, Op: &pb.SessionRequest_Open{Open: open}}); err != nil {
		_, err = stream.Recv() // the status that broke the send
		return nil, stream, err
	}
	type got struct {
		r   *pb.SessionResponse
		err error
	}
	first := make(chan got, 1)
	go func() {
		r, err := stream.Recv()
		first <- got{r, err}
	}()
	timer := time.NewTimer(c.timeout)
	defer timer.Stop()
	select {
	case g := <-first:
		if g.err != nil {
			return nil, stream, g.err
		}
		switch body := g.r.GetBody().(type) {
		case *pb.SessionResponse_Opened:
			return body.Opened, stream, nil
		case *pb.SessionResponse_Ended:
			return nil, nil, errorf(ErrSessionEnded, notOpen)
		case *pb.SessionResponse_Error:
			return nil, nil, requestError(body.Error)
		}
		return nil, nil, errorf(ErrIndeterminate, "unexpected answer to open: %v", g.r)
	case <-timer.C:
		return nil, nil, errorf(ErrIndeterminate, "no answer to opening the session within %d ms", c.timeout.Milliseconds())
	case <-ctx.Done():
		return nil, nil, errorf(ErrIndeterminate, "cancelled while the session was opened: %v", ctx.Err())
	}
}

// requestError is the error of a request the server could not judge.
func requestError(e *pb.RequestError) error {
	switch codes.Code(e.GetCode()) {
	case codes.InvalidArgument:
		return errorf(ErrInvalid, "%s", e.GetMessage())
	case codes.ResourceExhausted:
		return errorf(ErrExhausted, "%s", e.GetMessage())
	case codes.PermissionDenied:
		return errorf(ErrPermissionDenied, "%s", e.GetMessage())
	case codes.Unauthenticated:
		return errorf(ErrUnauthenticated, "%s", e.GetMessage())
	}
	return errorf(ErrIndeterminate, "%s: %s", codes.Code(e.GetCode()), e.GetMessage())
}
