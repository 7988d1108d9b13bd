package baton

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/baton-dev/baton/clients/go/internal/pb"
)

// dropProxy forwards loopback TCP to upstream. Once armed with a
// pattern, the connection whose request carries it gets no answer: the
// request reaches the server, whose bytes are then discarded for 300 ms
// (time to apply it and answer), and both sides are reset; or, with a
// hold, the answer is held that long, then forwarded (a late answer).
type dropProxy struct {
	listener net.Listener
	upstream string
	mu       sync.Mutex
	pattern  []byte
	hold     time.Duration
	dropped  atomic.Int32
	held     atomic.Int32
}

func newDropProxy(t *testing.T, upstream string) *dropProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &dropProxy{listener: l, upstream: upstream}
	t.Cleanup(func() { _ = l.Close() })
	go p.accept()
	return p
}

func (p *dropProxy) addr() string { return p.listener.Addr().String() }

func (p *dropProxy) arm(pattern string) { p.armHold(pattern, 0) }

// armHold holds the answer to the request carrying pattern for hold.
func (p *dropProxy) armHold(pattern string, hold time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pattern, p.hold = []byte(pattern), hold
}

func (p *dropProxy) accept() {
	for {
		client, err := p.listener.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = client.Close()
			continue
		}
		var doomed atomic.Int64 // 0: forward; -1: drop; above 0: hold (ns)
		go p.up(client, server, &doomed)
		go p.down(server, client, &doomed)
	}
}

func (p *dropProxy) up(client, server net.Conn, doomed *atomic.Int64) {
	buf := make([]byte, 65536)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			p.mu.Lock()
			drop := false
			if p.pattern != nil && bytes.Contains(buf[:n], p.pattern) {
				p.pattern = nil
				drop = p.hold == 0
				if drop {
					doomed.Store(-1)
				} else {
					doomed.Store(int64(p.hold))
				}
			}
			p.mu.Unlock()
			if _, err := server.Write(buf[:n]); err != nil {
				return
			}
			if drop {
				// Time for the server to apply the request and answer;
				// the answer is discarded (down forwards nothing now),
				// then both sides are reset.
				time.Sleep(300 * time.Millisecond)
				p.dropped.Add(1)
				reset(client)
				reset(server)
				return
			}
		}
		if err != nil {
			_ = server.(*net.TCPConn).CloseWrite()
			return
		}
	}
}

func (p *dropProxy) down(server, client net.Conn, doomed *atomic.Int64) {
	buf := make([]byte, 65536)
	for {
		n, err := server.Read(buf)
		if hold := doomed.Load(); n > 0 && hold > 0 {
			p.held.Add(1)
			time.Sleep(time.Duration(hold))
			doomed.Store(0)
		}
		if n > 0 && doomed.Load() < 0 {
			continue // the answer of a doomed request: never forwarded
		}
		if n > 0 {
			if _, err := client.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				reset(client)
			}
			_ = client.(*net.TCPConn).CloseWrite()
			return
		}
	}
}

// reset closes c with an RST (linger 0).
func reset(c net.Conn) {
	_ = c.(*net.TCPConn).SetLinger(0)
	_ = c.Close()
}

func TestALostAcquireAnswerIsSentAgainAndGrantsOnce(t *testing.T) {
	ctx := context.Background()
	addr := server(t)
	proxy := newDropProxy(t, addr)
	c := connect(t, proxy.addr())
	direct := connect(t, addr)

	proxy.arm("lost:go")
	lease, err := c.Acquire(ctx, "lost:go", WithTTL(30*time.Second))
	if err != nil {
		t.Fatalf("the repeat gets the grant: %v", err)
	}
	if proxy.dropped.Load() != 1 {
		t.Fatalf("the fault fired %d times, want 1", proxy.dropped.Load())
	}
	st, err := direct.Status(ctx, "lost:go")
	if err != nil || st.HolderToken != lease.Token {
		t.Fatalf("the one lease is the one answered: %+v, %v (lease token %d)", st, err, lease.Token)
	}
	if ok, err := c.Release(ctx, lease); err != nil || !ok {
		t.Fatalf("released: %v, %v", ok, err)
	}
	t.Logf("answers dropped: %d; orphan leases: 0 (the repeat got token %d)", proxy.dropped.Load(), lease.Token)

	// The negative control: the same fault on an acquire without a request
	// id, sent again by hand, finds the orphan its first attempt left.
	conn, err := grpc.NewClient(proxy.addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	raw := pb.NewLeasesClient(conn)
	ttl := uint64(30_000)
	request := &pb.AcquireRequest{Resources: []string{"lost:go:blind"}, TtlMs: &ttl}
	proxy.arm("lost:go:blind")
	if _, err := raw.Acquire(ctx, request); err == nil {
		t.Fatal("the answer was dropped: the first attempt must fail")
	}
	again, err := raw.Acquire(ctx, request)
	if err != nil || again.GetNotAcquired() == nil || again.GetNotAcquired().GetHolderToken() == 0 {
		t.Fatalf("a blind repeat finds the orphan holding the resource: %v, %v", again, err)
	}
	t.Logf("negative control: answers dropped %d, a blind repeat refused by the orphan (token %d)",
		proxy.dropped.Load(), again.GetNotAcquired().GetHolderToken())
}

// A grant that comes back after its TTL (the proxy holds the answer 2.5 s,
// the TTL is 1 s) is expired on arrival: the client releases it and says
// so, and nothing stays held.
func TestAGrantThatArrivesAfterItsTTLIsExpiredOnArrivalAndReleased(t *testing.T) {
	ctx := context.Background()
	addr := server(t)
	proxy := newDropProxy(t, addr)
	c := connect(t, proxy.addr())
	proxy.armHold("late:go", 2500*time.Millisecond)
	_, err := c.Acquire(ctx, "late:go", WithTTL(time.Second))
	if !errors.Is(err, ErrExpiredOnArrival) || proxy.held.Load() != 1 {
		t.Fatalf("expired on arrival (answers held: %d): %v", proxy.held.Load(), err)
	}
	st, err := connect(t, addr).Status(ctx, "late:go")
	if err != nil || st.HolderToken != 0 {
		t.Fatalf("nothing held after it: %+v, %v", st, err)
	}
}
