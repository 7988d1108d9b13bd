package baton

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/baton-dev/baton/clients/go/internal/pb"
)

// leaderMetadata names the leader in a follower's answer.
const leaderMetadata = "baton-leader"

// Client is a connection to a Baton server, or to the leader of a
// cluster: calls go to the leader (a follower's answer names it, and the
// call is sent there: the follower did nothing), a member that does not
// complete gRPC's handshake within the dial timeout is passed over, and a
// call that may have taken effect is never sent again (but an acquire,
// which carries a request id, may be: its repeat gets the same grant).
// Safe for concurrent use.
type Client struct {
	settings
	servers []string
	auth    string
	creds   credentials.TransportCredentials

	mu      sync.Mutex
	current int
	conns   map[string]*grpc.ClientConn
}

// New is a client of servers ("host:port", several separated by commas;
// "" reads BATON_SERVER, else 127.0.0.1:7700). Nothing is dialed yet: the
// first call dials. Bad settings are an [ErrInvalid] naming the rule.
func New(servers string, options ...Option) (*Client, error) {
	s := settings{set: map[string]bool{}}
	for _, o := range options {
		o(&s)
	}
	if err := s.resolve(); err != nil {
		return nil, err
	}
	if strings.TrimSpace(servers) == "" {
		servers = env("BATON_SERVER")
	}
	if servers == "" {
		servers = "127.0.0.1:7700"
	}
	c := &Client{settings: s, conns: map[string]*grpc.ClientConn{}}
	for _, part := range strings.Split(servers, ",") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		addr, err := Address(part)
		if err != nil {
			return nil, err
		}
		c.servers = append(c.servers, addr)
	}
	if len(c.servers) == 0 {
		return nil, invalidf("servers: name at least one host:port")
	}
	config, err := s.tlsConfig()
	if err != nil {
		return nil, err
	}
	c.creds = insecure.NewCredentials()
	if config != nil {
		c.creds = credentials.NewTLS(config)
	}
	token, err := s.token()
	if err != nil {
		return nil, err
	}
	if token != "" {
		c.auth = "Bearer " + token
	}
	return c, nil
}

// Close closes every connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var first error
	for addr, conn := range c.conns {
		if err := conn.Close(); err != nil && first == nil {
			first = err
		}
		delete(c.conns, addr)
	}
	return first
}

// Holder is the holder description this client sends ("" for none).
func (c *Client) Holder() string { return c.holder }

// CurrentServer is the server the next call goes to.
func (c *Client) CurrentServer() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.servers[c.current]
}

// conn is the connection to addr, made on first use.
func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if conn, ok := c.conns[addr]; ok {
		return conn, nil
	}
	conn, err := grpc.NewClient(addr,
		grpc.WithTransportCredentials(c.creds),
		// A connection whose server stopped answering is closed after a
		// dial timeout of silence, and the next call dials again.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{
			Time: c.dialTimeout, Timeout: c.dialTimeout, PermitWithoutStream: true,
		}),
		// Fixed flow-control windows (1 MiB, far above any answer) turn
		// off grpc-go's bandwidth probing: a PING and a window update
		// beside the small messages of a lease's cycle, 8% of a session's
		// cycles at 16 goroutines (clients/go/bench, 2026-12-06).
		grpc.WithInitialWindowSize(1<<20),
		grpc.WithInitialConnWindowSize(1<<20),
	)
	if err != nil {
		return nil, invalidf("server address %s: %v", addr, err)
	}
	c.conns[addr] = conn
	return conn, nil
}

// ready waits up to the dial timeout for addr's connection to complete
// gRPC's handshake (a stopped server accepts TCP but never answers it);
// "" if it did, else why not. Nothing is sent either way.
func (c *Client) ready(ctx context.Context, addr string) (*grpc.ClientConn, string) {
	conn, err := c.conn(addr)
	if err != nil {
		return nil, err.Error()
	}
	ctx, cancel := context.WithTimeout(ctx, c.dialTimeout)
	defer cancel()
	conn.Connect()
	for {
		state := conn.GetState()
		switch state {
		case connectivity.Ready:
			return conn, ""
		case connectivity.TransientFailure:
			return nil, "connection refused or failed: nothing listens there, or it is not Baton's gRPC port"
		}
		if !conn.WaitForStateChange(ctx, state) {
			return nil, fmt.Sprintf("no answer within the dial timeout of %d ms: the server is stopped or hung, or this is not Baton's gRPC port",
				c.dialTimeout.Milliseconds())
		}
	}
}

// kind says whether a call may be sent again after its request may have
// reached a server: a read may; an acquire with a request id may, marked
// as a repeat by the function; an effect never.
type kind struct {
	read   bool
	repeat func(since time.Duration)
}

// call sends one request to the leader, following redirects and passing
// over members that do not answer a dial, until the call's time is up.
func (c *Client) call(ctx context.Context, extra time.Duration, k kind,
	send func(context.Context, pb.LeasesClient, ...grpc.CallOption) error) error {
	started := time.Now()
	deadline := started.Add(c.timeout + extra)
	var unreachable []string
	var lost error
	pause := 20 * time.Millisecond
	for {
		addr, conn, err := c.pick(ctx, &unreachable)
		if err != nil {
			return afterLost(lost, err)
		}
		callCtx, cancel := context.WithDeadline(ctx, deadline)
		if c.auth != "" {
			callCtx = metadata.AppendToOutgoingContext(callCtx, "authorization", c.auth)
		}
		var header, trailer metadata.MD
		err = send(callCtx, pb.NewLeasesClient(conn), grpc.Header(&header), grpc.Trailer(&trailer))
		cancel()
		if err == nil {
			return nil
		}
		st, _ := status.FromError(err)
		if leader, named := leaderOf(header, trailer); named {
			if leader != "" {
				if next, err := Address(leader); err == nil && next != addr {
					c.switchTo(next)
					continue
				}
			}
			if time.Now().Add(pause).Before(deadline) {
				time.Sleep(pause)
				pause = min(pause*2, 500*time.Millisecond)
				continue
			}
			return afterLost(lost, errorf(ErrUnavailable, "%s: no leader is known yet (an election is under way); nothing was done", addr))
		}
		trouble := st.Code() == codes.Unavailable || st.Code() == codes.DeadlineExceeded
		if trouble && ctx.Err() == nil && time.Now().Before(deadline) && (k.read || k.repeat != nil) {
			if k.repeat != nil {
				if lost == nil {
					lost = mapError(err, addr, c.timeout+extra)
				}
				k.repeat(time.Since(started))
			}
			c.passOver(addr)
			continue
		}
		return afterLost(lost, mapError(err, addr, c.timeout+extra))
	}
}

// pick is the server for the next attempt: the current one if it answers
// a dial, else the next that does; a definite [ErrUnavailable] naming
// streamOnLeader opens a stream on the member that leads: open is tried
// on each member picked (the hung-member rule of [Client.pick]),
// following a follower's answer to the leader it names, or waiting for
// one to be elected, until the client's timeout. The stream lives under
// streamParent (with the client's token); open returns the stream's
// trailer with its error. It returns the stream's cancel on success, and
// the member last tried with the trailer and error of its refusal
// otherwise: the one loop of every stream (a session's, a watch's).
func (c *Client) streamOnLeader(ctx, streamParent context.Context,
	open func(streamCtx context.Context, conn *grpc.ClientConn) (metadata.MD, error)) (context.CancelFunc, string, metadata.MD, error) {
	deadline := time.Now().Add(c.timeout)
	var unreachable []string
	pause := 20 * time.Millisecond
	for {
		addr, conn, err := c.pick(ctx, &unreachable)
		if err != nil {
			return nil, addr, nil, err
		}
		streamCtx, cancel := context.WithCancel(streamParent)
		if c.auth != "" {
			streamCtx = metadata.AppendToOutgoingContext(streamCtx, "authorization", c.auth)
		}
		trailer, err := open(streamCtx, conn)
		if err == nil {
			return cancel, addr, nil, nil
		}
		cancel()
		if leader, named := leaderOf(nil, trailer); named {
			if next, err := Address(leader); leader != "" && err == nil && next != addr {
				c.switchTo(next)
				continue
			}
			if time.Now().Add(pause).Before(deadline) {
				time.Sleep(pause)
				pause = min(pause*2, 500*time.Millisecond)
				continue
			}
			return nil, addr, trailer, errorf(ErrUnavailable, "%s: no leader is known yet (an election is under way); nothing was done", addr)
		}
		return nil, addr, trailer, err
	}
}

// each once none is left.
func (c *Client) pick(ctx context.Context, unreachable *[]string) (string, *grpc.ClientConn, error) {
	for range c.servers {
		addr := c.CurrentServer()
		if contains(*unreachable, addr) {
			c.passOver(addr)
			continue
		}
		conn, why := c.ready(ctx, addr)
		if why == "" {
			return addr, conn, nil
		}
		*unreachable = append(*unreachable, addr+": "+why)
		c.passOver(addr)
	}
	if len(*unreachable) == 0 {
		return "", nil, errorf(ErrUnavailable, "cannot connect to any server; nothing was sent")
	}
	return "", nil, errorf(ErrUnavailable, "cannot connect to %s; nothing was sent", strings.Join(*unreachable, "; "))
}

func contains(list []string, addr string) bool {
	for _, u := range list {
		if strings.HasPrefix(u, addr+": ") {
			return true
		}
	}
	return false
}

// passOver makes the next server in the list current.
func (c *Client) passOver(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.servers[c.current] == addr {
		c.current = (c.current + 1) % len(c.servers)
	}
}

// switchTo makes addr current, adding it if it is not listed.
func (c *Client) switchTo(addr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, s := range c.servers {
		if s == addr {
			c.current = i
			return
		}
	}
	c.servers = append(c.servers, addr)
	c.current = len(c.servers) - 1
}

// leaderOf is a follower's answer: the leader it names ("" while none is
// known), and whether it was such an answer.
func leaderOf(header, trailer metadata.MD) (string, bool) {
	for _, md := range []metadata.MD{trailer, header} {
		if v := md.Get(leaderMetadata); len(v) > 0 {
			return v[0], true
		}
	}
	return "", false
}

// afterLost is the error of a call whose earlier attempt's answer was
// lost: what that attempt did is unknown, however the repeats failed.
func afterLost(lost, err error) error {
	if lost == nil || errors.Is(err, ErrIndeterminate) {
		return err
	}
	return errorf(ErrIndeterminate, "%v; sent again until the call's time was up, no repeat was answered: %v", lost, err)
}

// mapError is the error for a failed call at addr: definite when the
// status says nothing was done, [ErrIndeterminate] otherwise.
func mapError(err error, addr string, timeout time.Duration) error {
	st, _ := status.FromError(err)
	msg := st.Message()
	switch st.Code() {
	case codes.DeadlineExceeded:
		return errorf(ErrIndeterminate, "no answer from %s within %d ms: the server may be stopped, overloaded or cut off; the request may have taken effect", addr, timeout.Milliseconds())
	case codes.Unavailable:
		return errorf(ErrIndeterminate, "the connection to %s broke before an answer came (%s); the request may have taken effect", addr, msg)
	case codes.InvalidArgument, codes.OutOfRange:
		return errorf(ErrInvalid, "%s", msg)
	case codes.ResourceExhausted:
		return errorf(ErrExhausted, "%s", msg)
	case codes.Unauthenticated:
		return errorf(ErrUnauthenticated, "%s", msg)
	case codes.PermissionDenied:
		return errorf(ErrPermissionDenied, "%s", msg)
	case codes.Canceled:
		return errorf(ErrIndeterminate, "cancelled by the caller before an answer came; the request may have taken effect")
	}
	return errorf(ErrIndeterminate, "%s from %s: %s", st.Code(), addr, msg)
}
