// Package batontest starts real `baton serve` processes for tests: on
// free loopback ports, on a store of their own (or a PostgreSQL database
// for a cluster), stopped when the test ends, with their log printed if
// it failed. The binary is BATON_BIN, else the checkout's debug build
// (target/debug/baton in the test's directory or one above it).
package batontest

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Server is one running `baton serve`.
type Server struct {
	// Addr is its gRPC address (host:port); HTTP its HTTP address.
	Addr, HTTP string
	// Process is the running process, for signals.
	Process *os.Process
	bin     string
	args    []string
}

// Bin is the baton binary the servers run.
func Bin(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("BATON_BIN"); bin != "" {
		return bin
	}
	// The checkout's debug build (cargo build --bin baton).
	return checkoutFile(t, filepath.Join("target", "debug", "baton"))
}

// Start starts a server with args (a data dir of its own unless they
// name one, or a --store) and waits until it answers /healthz; it may be
// a follower. TTLs down to 100 ms are accepted.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	s := &Server{Addr: FreePort(t), HTTP: FreePort(t), bin: Bin(t)}
	if !slices.Contains(args, "--data-dir") && !slices.Contains(args, "--store") {
		args = append([]string{"--data-dir", filepath.Join(t.TempDir(), "data")}, args...)
	}
	s.args = append([]string{"serve", "--listen", s.Addr, "--http-listen", s.HTTP, "--ttl-min", "100ms"}, args...)
	s.start(t)
	return s
}

// Restart SIGKILLs the server and starts it again on its ports and store.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	_ = s.Process.Kill()
	_, _ = s.Process.Wait()
	s.start(t)
}

func (s *Server) start(t testing.TB) {
	t.Helper()
	cmd := exec.Command(s.bin, s.args...)
	logPath := filepath.Join(t.TempDir(), "server.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.Process = cmd.Process
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = log.Close()
		if t.Failed() {
			text, _ := os.ReadFile(logPath)
			t.Logf("server %s log:\n%s", s.Addr, text)
		}
	})
	for deadline := time.Now().Add(20 * time.Second); s.Healthz() == ""; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("baton serve on %s did not start", s.Addr)
		}
	}
}

// Healthz is the server's /healthz body ("" if it does not answer).
func (s *Server) Healthz() string {
	client := http.Client{Timeout: 500 * time.Millisecond}
	resp, err := client.Get("http://" + s.HTTP + "/healthz")
	if err != nil {
		return ""
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	return string(body)
}

// FreePort is a loopback address nothing listens on now.
func FreePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().String()
}

// PgDatabase is a fresh database on BATON_TEST_PG's server, dropped when
// the test ends; its connection string.
func PgDatabase(t testing.TB) string {
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

// Cluster starts n servers on one PostgreSQL database (leader TTL 1 s).
func Cluster(t testing.TB, n int) []*Server {
	t.Helper()
	store := PgDatabase(t)
	nodes := make([]*Server, n)
	for i := range nodes {
		nodes[i] = Start(t, "--store", store, "--leader-ttl", "1s")
	}
	return nodes
}

// Leader is the index of the server that says it leads, skipping skip.
func Leader(t testing.TB, nodes []*Server, skip int) int {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		for i, n := range nodes {
			if i != skip && strings.Contains(n.Healthz(), "ok leader") {
				return i
			}
		}
	}
	t.Fatal("no leader within 30 s")
	return -1
}

// FenceKitDatabase is a fresh database with the fence kit installed by
// its documented command (psql -f crates/fence/sql/install.sql); its
// connection string.
func FenceKitDatabase(t testing.TB) string {
	t.Helper()
	conninfo := PgDatabase(t)
	install := checkoutFile(t, filepath.Join("crates", "fence", "sql", "install.sql"))
	out, err := exec.Command("psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", conninfo, "-f", install).CombinedOutput()
	if err != nil {
		t.Fatalf("installing the fence kit: %v: %s", err, out)
	}
	return conninfo
}

// checkoutFile is path in the checkout, found from the test's directory
// upwards.
func checkoutFile(t testing.TB, path string) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		candidate := filepath.Join(dir, path)
		if _, err := os.Stat(candidate); err == nil {
			return candidate
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no %s in the checkout above the test", path)
		}
		dir = parent
	}
}
