package baton

import (
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// server is a real `baton serve` on free ports with a data dir of its
// own, stopped at the end of the test. The binary is BATON_BIN, else the
// workspace's debug build (cargo build --bin baton).
func server(t *testing.T) string {
	t.Helper()
	addr, _ := startServer(t)
	return addr
}

// startServer is [server] with its process, for signals.
func startServer(t *testing.T) (string, *os.Process) {
	t.Helper()
	bin := os.Getenv("BATON_BIN")
	if bin == "" {
		bin = filepath.Join("..", "..", "target", "debug", "baton")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no baton binary at %s (cargo build --bin baton, or set BATON_BIN): %v", bin, err)
	}
	grpcAddr, httpAddr := freePort(t), freePort(t)
	cmd := exec.Command(bin, "serve", "--listen", grpcAddr, "--http-listen", httpAddr,
		"--data-dir", filepath.Join(t.TempDir(), "data"), "--ttl-min", "100ms")
	logPath := filepath.Join(t.TempDir(), "server.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = log.Close()
		if t.Failed() {
			text, _ := os.ReadFile(logPath)
			t.Logf("server log:\n%s", text)
		}
	})
	for deadline := time.Now().Add(20 * time.Second); ; {
		resp, err := http.Get("http://" + httpAddr + "/readyz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == 200 {
				return grpcAddr, cmd.Process
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("baton serve on %s did not become ready", grpcAddr)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
