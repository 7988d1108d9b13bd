package baton

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/baton-dev/baton/clients/go/batontest"
)

// Three servers on one PostgreSQL database: calls listed to a follower
// first reach the leader, and a lease keeps its token through a leader
// SIGKILL, renewed on the new leader.
func TestCallsFollowTheLeaderAndALeaseOutlivesALeaderKill(t *testing.T) {
	ctx := context.Background()
	nodes := batontest.Cluster(t, 3)
	first := batontest.Leader(t, nodes, -1)
	follower := nodes[(first+1)%3]
	// The follower first: its answer names the leader, and the call goes there.
	addrs := []string{follower.Addr}
	for i, n := range nodes {
		if n != follower {
			addrs = append(addrs, nodes[i].Addr)
		}
	}
	c := connect(t, strings.Join(addrs, ","), WithHolder("go cluster worker"), WithDialTimeout(300*time.Millisecond))
	lease, err := c.Acquire(ctx, "go:cluster", WithTTL(30*time.Second))
	if err != nil {
		t.Fatalf("through a follower: %v", err)
	}
	if c.CurrentServer() != nodes[first].Addr {
		t.Fatalf("current %s, want the leader %s", c.CurrentServer(), nodes[first].Addr)
	}
	session, err := c.OpenSession(ctx, 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = session.Close(ctx) }()
	tied, err := session.Acquire(ctx, "go:cluster:session")
	if err != nil {
		t.Fatal(err)
	}
	kept := session.Keep(ctx, tied)
	if err := nodes[first].Process.Kill(); err != nil {
		t.Fatal(err)
	}
	next := batontest.Leader(t, nodes, first)
	for session.Resumes() == 0 {
		select {
		case <-session.Done():
			t.Fatalf("the session ended instead of resuming on the new leader: %v", session.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err := kept.Err(); err != nil {
		t.Fatalf("the session lease is still certain: %v", err)
	}
	if st, err := c.Status(ctx, "go:cluster:session"); err != nil || st.HolderToken != tied.Token {
		t.Fatalf("the session lease kept its token: %+v, %v", st, err)
	}
	renewed, err := c.Renew(ctx, lease)
	if err != nil || renewed.Token != lease.Token {
		t.Fatalf("renewed on the new leader: %+v, %v", renewed, err)
	}
	st, err := c.Status(ctx, "go:cluster")
	if err != nil || st.HolderToken != lease.Token || st.Holder != "go cluster worker" {
		t.Fatalf("status on the new leader: %+v, %v", st, err)
	}
	if c.CurrentServer() != nodes[next].Addr {
		t.Fatalf("current %s, want the new leader %s", c.CurrentServer(), nodes[next].Addr)
	}
	t.Logf("leader %d killed; node %d leads; the unary lease kept token %d, the session lease %d (session resumed %d times)",
		first, next, lease.Token, tied.Token, session.Resumes())
}
