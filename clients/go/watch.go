package baton

import (
	"context"
	"errors"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/baton-dev/baton/clients/go/internal/pb"
)

// ErrWatchEnded: the server ended the watch (a restart, a leadership
// change, a shutdown): watch again, from a new snapshot.
var ErrWatchEnded = errors.New("watch ended")

// Holder is a holder in a watch's snapshot.
type Holder struct {
	Resource  string
	Token     uint64
	Remaining time.Duration
	Waiters   uint64
	Holder    string
}

// Change is one change of holder.
type Change struct {
	Seq uint64
	// Kind is "granted", "handed_off", "released", "expired" or "fenced".
	Kind     string
	Resource string
	// Token is the lease's token; for a fence, the fence's own.
	Token uint64
	// RevokedToken is, for a fence, the revoked lease's token (0 if none).
	RevokedToken uint64
	// Holder is the new holder's description (a grant), or the one that lost it.
	Holder string
}

var kinds = map[pb.WatchEvent_Kind]string{
	pb.WatchEvent_GRANTED: "granted", pb.WatchEvent_HANDED_OFF: "handed_off",
	pb.WatchEvent_RELEASED: "released", pb.WatchEvent_EXPIRED: "expired", pb.WatchEvent_FENCED: "fenced",
}

// Watch is an open watch: Holders at Seq, then every later change in
// commit order, with no gap, from [Watch.Next].
type Watch struct {
	Seq     uint64
	Holders []Holder

	stream  pb.Leases_WatchClient
	cancel  context.CancelFunc
	pending []Change
}

// Watch watches every change of holder under prefix (it needs `read` on
// it); the snapshot is read before it returns. Close it to stop.
func (c *Client) Watch(ctx context.Context, prefix string) (*Watch, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(c.timeout)
	var unreachable []string
	for {
		addr, conn, err := c.pick(ctx, &unreachable)
		if err != nil {
			return nil, err
		}
		streamCtx, cancel := context.WithCancel(ctx)
		if c.auth != "" {
			streamCtx = metadata.AppendToOutgoingContext(streamCtx, "authorization", c.auth)
		}
		stream, err := pb.NewLeasesClient(conn).Watch(streamCtx, &pb.WatchRequest{Prefix: prefix})
		var w *Watch
		if err == nil {
			w, err = start(stream)
		}
		if err == nil {
			w.cancel = cancel
			return w, nil
		}
		cancel()
		var trailer metadata.MD
		if stream != nil {
			trailer = stream.Trailer()
		}
		if leader, named := leaderOf(nil, trailer); named && time.Now().Before(deadline) {
			if next, aerr := Address(leader); leader != "" && aerr == nil && next != addr {
				c.switchTo(next)
			} else {
				time.Sleep(50 * time.Millisecond)
			}
			continue
		}
		var ours *Error
		if errors.As(err, &ours) {
			return nil, err
		}
		return nil, mapError(err, addr, c.timeout)
	}
}

// start reads the snapshot, which may come in several messages.
func start(stream pb.Leases_WatchClient) (*Watch, error) {
	w := &Watch{stream: stream}
	for {
		m, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		s := m.GetSnapshot()
		if s == nil {
			return nil, errorf(ErrIndeterminate, "a watch must start with its snapshot: %v", m)
		}
		w.Seq = s.GetSeq()
		for _, h := range s.GetHolders() {
			w.Holders = append(w.Holders, Holder{
				Resource: h.GetResource(), Token: h.GetToken(), Waiters: h.GetNWaiters(), Holder: h.GetHolder(),
				Remaining: time.Duration(h.GetRemainingMs()) * time.Millisecond,
			})
		}
		if s.GetComplete() {
			return w, nil
		}
	}
}

// Next is the next change, waiting for it; [ErrWatchEnded] when the
// server ended the watch (watch again, from a new snapshot).
func (w *Watch) Next() (Change, error) {
	for len(w.pending) == 0 {
		m, err := w.stream.Recv()
		if err != nil {
			switch status.Code(err) {
			case codes.Unavailable, codes.Canceled:
				return Change{}, errorf(ErrWatchEnded, "%s: watch again, from a new snapshot", status.Convert(err).Message())
			case codes.ResourceExhausted:
				return Change{}, errorf(ErrExhausted, "%s", status.Convert(err).Message())
			}
			return Change{}, mapError(err, "the server", 0)
		}
		for _, ev := range m.GetEvents().GetEvents() {
			w.pending = append(w.pending, Change{
				Seq: ev.GetSeq(), Kind: kinds[ev.GetKind()], Resource: ev.GetResource(), Token: ev.GetToken(),
				RevokedToken: ev.GetRevokedToken(), Holder: ev.GetHolder(),
			})
		}
	}
	next := w.pending[0]
	w.pending = w.pending[1:]
	return next, nil
}

// Close stops the watch.
func (w *Watch) Close() { w.cancel() }
