package baton

import (
	"context"
	"errors"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/baton-dev/baton/clients/go/internal/pb"
)

// ErrWatchEnded: the server ended the watch (a restart, a leadership
// change, a shutdown) and it was not resumed ([WatchOnce]): resume with
// [WatchAfter], or watch again from a new snapshot.
var ErrWatchEnded = errors.New("watch ended")

// ErrWatchTooOld: a watch asked to resume after a number older than the
// changes the server keeps; [*WatchTooOldError] has the oldest number it
// resumes from. Watch again from a new snapshot (a watch resuming by
// itself does so). Nothing was streamed.
var ErrWatchTooOld = errors.New("watch number too old")

// WatchTooOldError is an [ErrWatchTooOld] with the oldest number the
// server resumes a watch from.
type WatchTooOldError struct {
	OldestSeq uint64
	Message   string
}

func (e *WatchTooOldError) Error() string { return e.Message }

// Unwrap gives [ErrWatchTooOld].
func (e *WatchTooOldError) Unwrap() error { return ErrWatchTooOld }

// ResumeFor is how long a watch tries to resume without an answer
// before [Watch.Next] returns the last failure.
const ResumeFor = 60 * time.Second

// Holder is a holder in a watch's snapshot.
type Holder struct {
	Resource  string
	Token     uint64
	Remaining time.Duration
	Waiters   uint64
	Holder    string
}

// Change is one change of holder, or a new snapshot.
type Change struct {
	Seq uint64
	// Kind is "granted", "handed_off", "released", "expired" or "fenced";
	// "resnapshot" when the watch resumed after the server had dropped the
	// changes since the last one returned (it was away longer than the
	// server keeps them): Holders are then the holders at Seq, and what
	// changed in between is not told: Resnapshot holds the holders at Seq.
	Kind     string
	Resource string
	// Token is the lease's token; for a fence, the fence's own.
	Token uint64
	// RevokedToken is, for a fence, the revoked lease's token (0 if none).
	RevokedToken uint64
	// Holder is the new holder's description (a grant), or the one that lost it.
	Holder string
	// Resnapshot is a "resnapshot"'s holders (nil for a change).
	Resnapshot *Resnapshot
}

// Resnapshot is the snapshot a watch took when it resumed too late.
type Resnapshot struct {
	Holders []Holder
}

var kinds = map[pb.WatchEvent_Kind]string{
	pb.WatchEvent_GRANTED: "granted", pb.WatchEvent_HANDED_OFF: "handed_off",
	pb.WatchEvent_RELEASED: "released", pb.WatchEvent_EXPIRED: "expired", pb.WatchEvent_FENCED: "fenced",
}

// Watch is an open watch: Holders at Seq, then every later change in
// commit order, with no gap, from [Watch.Next]. It resumes by itself
// after the last number returned when its stream ends (a restart, a new
// leader, a broken connection, falling too far behind), following the
// leader, for up to [ResumeFor] without an answer.
type Watch struct {
	// Seq is the snapshot's number (a watch started with [WatchAfter]:
	// that number).
	Seq     uint64
	Holders []Holder

	client  *Client
	ctx     context.Context
	prefix  string
	once    bool
	lastSeq uint64
	stream  pb.Leases_WatchClient
	cancel  context.CancelFunc
	pending []Change
}

// WatchOption sets how a watch starts and ends.
type WatchOption func(*watchSettings)

type watchSettings struct {
	after *uint64
	once  bool
}

// WatchAfter starts the watch after the change numbered seq (from an
// earlier watch) instead of from a snapshot: no gap, no duplicate. A
// number older than the changes the server keeps is [ErrWatchTooOld];
// one above its last change is [ErrInvalid].
func WatchAfter(seq uint64) WatchOption {
	return func(s *watchSettings) { s.after = &seq }
}

// WatchOnce never resumes: the stream's end is [ErrWatchEnded] (or
// [ErrExhausted] for a watcher cut off for falling behind).
func WatchOnce() WatchOption {
	return func(s *watchSettings) { s.once = true }
}

// Watch watches every change of holder under prefix (it needs `read` on
// it); the snapshot is read before it returns. Close it to stop.
func (c *Client) Watch(ctx context.Context, prefix string, options ...WatchOption) (*Watch, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, err
	}
	var s watchSettings
	for _, o := range options {
		o(&s)
	}
	w := &Watch{client: c, ctx: ctx, prefix: prefix, once: s.once}
	seq, holders, err := w.open(s.after)
	if err != nil {
		return nil, err
	}
	w.Seq, w.Holders, w.lastSeq = seq, holders, seq
	return w, nil
}

// LastSeq is the last number returned (or the snapshot's): a watch
// started again with [WatchAfter] from it misses nothing.
func (w *Watch) LastSeq() uint64 { return w.lastSeq }

// open starts the stream on the member that leads: after *after, or from
// a snapshot, read before it returns.
func (w *Watch) open(after *uint64) (uint64, []Holder, error) {
	c := w.client
	request := &pb.WatchRequest{Prefix: w.prefix, AfterSeq: after}
	var stream pb.Leases_WatchClient
	var seq uint64
	var holders []Holder
	cancel, addr, trailer, err := c.streamOnLeader(w.ctx, w.ctx,
		func(streamCtx context.Context, conn *grpc.ClientConn) (metadata.MD, error) {
			var err error
			stream, err = pb.NewLeasesClient(conn).Watch(streamCtx, request)
			if err != nil {
				return nil, err
			}
			seq, holders, err = begin(stream, after)
			if err != nil {
				return stream.Trailer(), err
			}
			return nil, nil
		})
	if err == nil {
		w.stream, w.cancel = stream, cancel
		return seq, holders, nil
	}
	var ours *Error
	if errors.As(err, &ours) {
		return 0, nil, err
	}
	if tooOld := tooOldOf(err, trailer); tooOld != nil {
		return 0, nil, tooOld
	}
	return 0, nil, mapError(err, addr, c.timeout)
}

// tooOldOf is a watch's OUT_OF_RANGE with the oldest number it resumes
// from, as a [*WatchTooOldError].
func tooOldOf(err error, trailer metadata.MD) error {
	st, _ := status.FromError(err)
	if st.Code() != codes.OutOfRange {
		return nil
	}
	values := trailer.Get("baton-oldest-seq")
	if len(values) == 0 {
		return nil
	}
	oldest, perr := strconv.ParseUint(values[0], 10, 64)
	if perr != nil {
		return nil
	}
	return &WatchTooOldError{OldestSeq: oldest, Message: st.Message()}
}

// begin reads a new stream's start: nothing for a resumed one (a refusal
// ends it before any message: its headers say whether it was), else the
// whole snapshot, which may come in several messages.
func begin(stream pb.Leases_WatchClient, after *uint64) (uint64, []Holder, error) {
	if after != nil {
		md, err := stream.Header()
		if err == nil && md == nil {
			// Ended without headers: the status is the refusal.
			_, err = stream.Recv()
		}
		if err != nil {
			return 0, nil, err
		}
		return *after, nil, nil
	}
	var holders []Holder
	for {
		m, err := stream.Recv()
		if err != nil {
			return 0, nil, err
		}
		s := m.GetSnapshot()
		if s == nil {
			return 0, nil, errorf(ErrIndeterminate, "a watch must start with its snapshot: %v", m)
		}
		for _, h := range s.GetHolders() {
			holders = append(holders, Holder{
				Resource: h.GetResource(), Token: h.GetToken(), Waiters: h.GetNWaiters(), Holder: h.GetHolder(),
				Remaining: time.Duration(h.GetRemainingMs()) * time.Millisecond,
			})
		}
		if s.GetComplete() {
			return s.GetSeq(), holders, nil
		}
	}
}

// Next is the next change, waiting for it, or a "resnapshot" (see
// [Change.Kind]). It returns an error only for a failure a resumption
// does not mend (a refusal, no answer for [ResumeFor], the watch's
// context ended), or any end of the stream with [WatchOnce].
func (w *Watch) Next() (Change, error) {
	for {
		if len(w.pending) > 0 {
			next := w.pending[0]
			w.pending = w.pending[1:]
			w.lastSeq = next.Seq
			return next, nil
		}
		m, err := w.stream.Recv()
		if err == nil {
			for _, ev := range m.GetEvents().GetEvents() {
				if ev.GetSeq() <= w.lastSeq {
					continue
				}
				w.pending = append(w.pending, Change{
					Seq: ev.GetSeq(), Kind: kinds[ev.GetKind()], Resource: ev.GetResource(), Token: ev.GetToken(),
					RevokedToken: ev.GetRevokedToken(), Holder: ev.GetHolder(),
				})
			}
			continue
		}
		failure := ended(err, w.tooOld(err))
		resumable := mendedByResuming(failure) || errors.Is(failure, ErrWatchTooOld)
		if w.once || w.ctx.Err() != nil || !resumable {
			return Change{}, failure
		}
		if resnapshot, err := w.resume(); err != nil || resnapshot != nil {
			if err != nil {
				return Change{}, err
			}
			return *resnapshot, nil
		}
	}
}

func (w *Watch) tooOld(err error) error {
	return tooOldOf(err, w.stream.Trailer())
}

// ended is the error a stream's end is.
func ended(err error, tooOld error) error {
	if tooOld != nil {
		return tooOld
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.Canceled:
		return errorf(ErrWatchEnded, "%s", status.Convert(err).Message())
	case codes.ResourceExhausted:
		return errorf(ErrExhausted, "%s", status.Convert(err).Message())
	}
	return mapError(err, "the server", 0)
}

// mendedByResuming says whether a watch that ended with err may resume:
// its stream ended or its connection broke, or it fell behind; never a
// refusal.
func mendedByResuming(err error) bool {
	for _, kind := range []error{ErrWatchEnded, ErrExhausted, ErrIndeterminate, ErrUnavailable} {
		if errors.Is(err, kind) {
			return true
		}
	}
	return false
}

// resume opens the stream again after the last number returned,
// retrying for up to [ResumeFor]; a resnapshot if the server no longer
// keeps the changes since then.
func (w *Watch) resume() (*Change, error) {
	started := time.Now()
	pause := 50 * time.Millisecond
	for {
		w.Close()
		after := w.lastSeq
		_, _, err := w.open(&after)
		if err == nil {
			return nil, nil
		}
		if errors.Is(err, ErrWatchTooOld) {
			seq, holders, serr := w.open(nil)
			if serr == nil {
				w.lastSeq = seq
				return &Change{Seq: seq, Kind: "resnapshot", Resource: w.prefix, Resnapshot: &Resnapshot{Holders: holders}}, nil
			}
			err = serr
		}
		if !mendedByResuming(err) || w.ctx.Err() != nil || time.Since(started) >= ResumeFor {
			return nil, err
		}
		select {
		case <-time.After(pause):
		case <-w.ctx.Done():
			return nil, errors.Join(w.ctx.Err(), err)
		}
		pause = min(pause*2, time.Second)
	}
}

// Close stops the watch.
func (w *Watch) Close() {
	if w.cancel != nil {
		w.cancel()
	}
}
