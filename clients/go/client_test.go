package baton

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

func connect(t *testing.T, servers string, options ...Option) *Client {
	t.Helper()
	c, err := New(servers, options...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestALeaseIsAcquiredRenewedFencedAndReleased(t *testing.T) {
	ctx := context.Background()
	c := connect(t, server(t), WithHolder("go test"))
	before := time.Now()
	lease, err := c.Acquire(ctx, "job:go:1", WithTTL(5*time.Second))
	returned := time.Now()
	if err != nil {
		t.Fatal(err)
	}
	if lease.Token == 0 || len(lease.AcquisitionID) != 16 || lease.TTL != 5*time.Second {
		t.Fatalf("lease %+v", lease)
	}
	// Counted from the request's send, which came between the two.
	if from := lease.ValidUntil.Add(-5 * time.Second); from.Before(before) || from.After(returned) {
		t.Fatalf("valid until %v is not the TTL from the send (between %v and %v)", lease.ValidUntil, before, returned)
	}
	st, err := c.Status(ctx, "job:go:1")
	if err != nil || st.HolderToken != lease.Token || st.Holder != "go test" {
		t.Fatalf("status %+v, %v", st, err)
	}
	// Held: a second acquire is refused, naming the resource and holder.
	_, err = c.Acquire(ctx, "job:go:1")
	var na *NotAcquiredError
	if !errors.Is(err, ErrNotAcquired) || !errors.As(err, &na) || na.HolderToken != lease.Token || na.Resource != "job:go:1" {
		t.Fatalf("second acquire: %v (%+v)", err, na)
	}
	// ...and every blocker: its holder, how long it has held it, its TTL left.
	if len(na.Blockers) != 1 || len(na.Blockers[0].Holders) != 1 || !na.Blockers[0].Readable {
		t.Fatalf("blockers %+v", na.Blockers)
	}
	if h := na.Blockers[0].Holders[0]; h.Token != lease.Token || h.Holder != "go test" || h.HeldFor < 0 ||
		h.Remaining <= 0 || h.Remaining > 5*time.Second || h.SessionBound {
		t.Fatalf("blocking holder %+v", h)
	}
	if !strings.Contains(err.Error(), `job:go:1 held token=`) || !strings.Contains(err.Error(), `holder="go test"`) {
		t.Fatalf("message %q", err)
	}
	renewed, err := c.Renew(ctx, lease)
	if err != nil || renewed.Token != lease.Token || !renewed.ValidUntil.After(lease.ValidUntil) {
		t.Fatalf("renew: %+v, %v", renewed, err)
	}
	fenced, err := c.Fence(ctx, "job:go:1")
	if err != nil || fenced.RevokedToken != lease.Token || fenced.Token <= lease.Token {
		t.Fatalf("fence: %+v, %v", fenced, err)
	}
	if _, err := c.Renew(ctx, lease); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("renew after a fence: %v", err)
	}
	if released, err := c.Release(ctx, lease); err != nil || released {
		t.Fatalf("release after a fence: %v, %v", released, err)
	}
	next, err := c.Acquire(ctx, "job:go:1", WithTTL(time.Second))
	if err != nil || next.Token <= fenced.Token {
		t.Fatalf("after the fence: %+v, %v", next, err)
	}
	if released, err := c.Release(ctx, next); err != nil || !released {
		t.Fatalf("release: %v, %v", released, err)
	}
	list, err := c.List(ctx, "job:go:", "", 0)
	if err != nil || len(list) != 0 {
		t.Fatalf("list after release: %v, %v", list, err)
	}
}

func TestAWaitingAcquireIsGrantedFirstComeFirstServedOrTimesOut(t *testing.T) {
	ctx := context.Background()
	c := connect(t, server(t))
	first, err := c.Acquire(ctx, "job:go:wait", WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Acquire(ctx, "job:go:wait", WithWait(150*time.Millisecond))
	var na *NotAcquiredError
	if !errors.As(err, &na) || na.Reason != "timed out" {
		t.Fatalf("the wait ran out: %v", err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		_, _ = c.Release(ctx, first)
	}()
	second, err := c.Acquire(ctx, "job:go:wait", WithWait(5*time.Second), WithTTL(time.Second))
	if err != nil || second.Token <= first.Token {
		t.Fatalf("handed on: %+v, %v", second, err)
	}
}

func TestBadInputIsRefusedBeforeAnythingIsSent(t *testing.T) {
	// Nothing listens on port 1: a dial would fail as Unavailable, so an
	// ErrInvalid proves the rule was checked first.
	c := connect(t, "127.0.0.1:1")
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		call func() error
		says string
	}{
		{"empty", func() error { _, err := c.Acquire(ctx, ""); return err }, "resource name is empty"},
		{"segment", func() error { _, err := c.Acquire(ctx, "a::b"); return err }, "empty ':'-separated segment at byte 2"},
		{"control", func() error { _, err := c.Acquire(ctx, "a\x07b"); return err }, "control character U+0007 at byte 1"},
		{"invisible", func() error { _, err := c.Acquire(ctx, "zw:a\u200bb"); return err }, "invisible or formatting character U+200B at byte 4"},
		{"space", func() error { _, err := c.Acquire(ctx, " a"); return err }, "leading or trailing whitespace"},
		{"long", func() error { _, err := c.Acquire(ctx, strings.Repeat("x", 513)); return err }, "513 bytes long; the limit is 512"},
		{"ttl0", func() error { _, err := c.Acquire(ctx, "a", WithTTL(-1)); return err }, "negative"},
		{"ttl-year", func() error { _, err := c.Acquire(ctx, "a", WithTTL(366*24*time.Hour)); return err }, "at most 365 days"},
		{"ttl-us", func() error { _, err := c.Acquire(ctx, "a", WithTTL(1500*time.Microsecond)); return err }, "whole number of milliseconds"},
		{"prefix", func() error { _, err := c.List(ctx, "a\x07", "", 0); return err }, "names never do"},
	} {
		err := tc.call()
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: %v, want ErrInvalid saying %q", tc.name, err, tc.says)
		}
	}
	if _, err := New("", WithHolder("job\u200d7")); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "U+200D") {
		t.Errorf("holder: %v", err)
	}
	// NFC: the canonical form is what is sent.
	if name, err := CheckResource("cafe\u0301", false); err != nil || name != "caf\u00e9" {
		t.Errorf("NFC: %q, %v", name, err)
	}
}

func TestAddressesAreReadAsTheOtherClientsReadThem(t *testing.T) {
	for in, want := range map[string]string{
		"7700":                 "127.0.0.1:7700",
		"localhost":            "localhost:7700",
		"http://10.0.0.2:7701": "10.0.0.2:7701",
		"https://h/":           "h:7700",
		"[::1]":                "[::1]:7700",
		"[::1]:9":              "[::1]:9",
	} {
		if got, err := Address(in); err != nil || got != want {
			t.Errorf("%q: %q, %v; want %q", in, got, err, want)
		}
	}
	for in, says := range map[string]string{
		"127.0.0.1:99999": "port 99999 is out of range",
		"ftp://h":         "the scheme \"ftp\" is not http or https",
		"::1":             "write an IPv6 address in brackets",
		"h:x":             "port \"x\" is not a number",
		"user@h":          "not an address",
	} {
		if _, err := Address(in); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), says) {
			t.Errorf("%q: %v; want %q", in, err, says)
		}
	}
}

func TestAMemberThatNeverAnswersIsPassedOverAndNoneReachableIsDefinite(t *testing.T) {
	ctx := context.Background()
	// A listener that accepts TCP and never speaks: a frozen server.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = silent.Close() }()
	real := server(t)
	c := connect(t, silent.Addr().String()+","+real, WithDialTimeout(300*time.Millisecond))
	started := time.Now()
	lease, err := c.Acquire(ctx, "job:go:reach", WithTTL(time.Second))
	if err != nil {
		t.Fatalf("the second member answers: %v", err)
	}
	if took := time.Since(started); took > 5*time.Second {
		t.Fatalf("took %v: a silent member must cost a dial timeout, not the call's", took)
	}
	if c.CurrentServer() != real || lease.Token == 0 {
		t.Fatalf("current %s, want %s", c.CurrentServer(), real)
	}
	lone := connect(t, silent.Addr().String(), WithDialTimeout(200*time.Millisecond))
	_, err = lone.Acquire(ctx, "job:go:reach")
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "nothing was sent") {
		t.Fatalf("no member answers: %v", err)
	}
}

func TestConcurrentCallsOnOneClient(t *testing.T) {
	ctx := context.Background()
	c := connect(t, server(t))
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 20 {
				l, err := c.Acquire(ctx, fmt.Sprintf("job:go:c%d", i), WithTTL(time.Second))
				if err != nil {
					errs <- fmt.Errorf("acquire %d/%d: %w", i, j, err)
					return
				}
				if ok, err := c.Release(ctx, l); err != nil || !ok {
					errs <- fmt.Errorf("release %d/%d: %v %w", i, j, ok, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestAnAcquireOfSeveralResourcesGetsAllOrNothing(t *testing.T) {
	ctx := context.Background()
	c := connect(t, server(t))
	held, err := c.Acquire(ctx, "job:go:all:b", WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.AcquireAll(ctx, []string{"job:go:all:a", "job:go:all:b"}, WithTTL(10*time.Second))
	var na *NotAcquiredError
	if !errors.As(err, &na) || na.Resource != "job:go:all:b" || na.HolderToken != held.Token {
		t.Fatalf("refused, naming the held one: %v", err)
	}
	if st, err := c.Status(ctx, "job:go:all:a"); err != nil || st.HolderToken != 0 {
		t.Fatalf("nothing granted: %+v, %v", st, err)
	}
	if _, err := c.Release(ctx, held); err != nil {
		t.Fatal(err)
	}
	both, err := c.AcquireAll(ctx, []string{"job:go:all:a", "job:go:all:b"}, WithTTL(10*time.Second))
	if err != nil || len(both) != 2 || both[0].Resource != "job:go:all:a" || both[1].Token == 0 {
		t.Fatalf("both, in request order: %+v, %v", both, err)
	}
	s := openSession(t, c, 5*time.Second)
	if _, err := s.AcquireAll(ctx, []string{"job:go:all:c", "job:go:all:a"}); !errors.As(err, &na) || na.Resource != "job:go:all:a" {
		t.Fatalf("on a session too: %v", err)
	}
	if st, _ := c.Status(ctx, "job:go:all:c"); st.HolderToken != 0 {
		t.Fatalf("nothing granted on the session: %+v", st)
	}
}
