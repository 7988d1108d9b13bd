package baton

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// node is a real `baton serve` on free ports, stopped at the end of the
// test. The binary is BATON_BIN, else the workspace's debug build (cargo
// build --bin baton).
type node struct {
	grpc, http string
	process    *os.Process
	args       []string
}

// server is a node on a data dir of its own; its gRPC address.
func server(t *testing.T) string {
	t.Helper()
	return startNode(t).grpc
}

// startServer is [server] with its process, for signals.
func startServer(t *testing.T) (string, *os.Process) {
	t.Helper()
	n := startNode(t)
	return n.grpc, n.process
}

// startNode starts a server with args (the embedded store without them)
// and waits until it is live; it may be a follower.
func startNode(t *testing.T, args ...string) *node {
	t.Helper()
	bin := os.Getenv("BATON_BIN")
	if bin == "" {
		bin = filepath.Join("..", "..", "target", "debug", "baton")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no baton binary at %s (cargo build --bin baton, or set BATON_BIN): %v", bin, err)
	}
	n := &node{grpc: freePort(t), http: freePort(t)}
	if len(args) == 0 {
		args = []string{"--data-dir", filepath.Join(t.TempDir(), "data")}
	}
	n.args = append([]string{"serve", "--listen", n.grpc, "--http-listen", n.http, "--ttl-min", "100ms"}, args...)
	n.start(t, bin)
	return n
}

// restart SIGKILLs the node and starts it again on its ports and store.
func (n *node) restart(t *testing.T) {
	t.Helper()
	_ = n.process.Kill()
	_, _ = n.process.Wait()
	bin := os.Getenv("BATON_BIN")
	if bin == "" {
		bin = filepath.Join("..", "..", "target", "debug", "baton")
	}
	n.start(t, bin)
}

func (n *node) start(t *testing.T, bin string) {
	t.Helper()
	cmd := exec.Command(bin, n.args...)
	logPath := filepath.Join(t.TempDir(), "server.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n.process = cmd.Process
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = log.Close()
		if t.Failed() {
			text, _ := os.ReadFile(logPath)
			t.Logf("server %s log:\n%s", n.grpc, text)
		}
	})
	for deadline := time.Now().Add(20 * time.Second); ; {
		if n.healthz() != "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("baton serve on %s did not start", n.grpc)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// healthz is the node's /healthz body ("" if it does not answer).
func (n *node) healthz() string {
	client := http.Client{Timeout: 500 * time.Millisecond}
	resp, err := client.Get("http://" + n.http + "/healthz")
	if err != nil {
		return ""
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

// pgDatabase is a fresh database on BATON_TEST_PG's server, dropped at
// the end of the test; its connection string.
func pgDatabase(t *testing.T) string {
	t.Helper()
	base := os.Getenv("BATON_TEST_PG")
	if base == "" {
		t.Fatal("BATON_TEST_PG is not set (scripts/test-go starts a private PostgreSQL; or set it, like host=127.0.0.1 user=postgres)")
	}
	name := fmt.Sprintf("goclient_%d_%d", os.Getpid(), time.Now().UnixNano()%1_000_000_000)
	psql := func(sql string) {
		out, err := exec.Command("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", base, "-c", sql).CombinedOutput()
		if err != nil {
			t.Fatalf("psql %q: %v: %s", sql, err, out)
		}
	}
	psql(fmt.Sprintf(`CREATE DATABASE "%s"`, name))
	t.Cleanup(func() { psql(fmt.Sprintf(`DROP DATABASE IF EXISTS "%s" WITH (FORCE)`, name)) })
	return strings.TrimSpace(base) + " dbname=" + name
}

// leader is the index of the node that says it leads, skipping skip.
func leader(t *testing.T, nodes []*node, skip int) int {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for i, n := range nodes {
			if i != skip && strings.Contains(n.healthz(), "ok leader") {
				return i
			}
		}
	}
	t.Fatal("no leader within 30 s")
	return -1
}
