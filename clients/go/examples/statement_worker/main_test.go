package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	baton "github.com/baton-dev/baton/clients/go"
	"github.com/baton-dev/baton/clients/go/batontest"
	"github.com/baton-dev/baton/clients/go/fence"
)

// The stale-worker story with the example worker as a real process:
// SIGSTOPped between its last check and its publish, its lease fenced
// (as a pause past its TTL would end it) and a second worker publishes;
// resumed, its publish is refused as stale (exit 4) and the statement
// keeps the second worker's object.
func TestAWorkerPausedBeforeItsPublishIsRefusedAsStale(t *testing.T) {
	server := batontest.Start(t)
	dsn := batontest.FenceKitDatabase(t)
	bin := filepath.Join(t.TempDir(), "statement_worker")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v: %s", err, out)
	}
	worker := func(key string, window time.Duration) *exec.Cmd {
		return exec.Command(bin, "-server", server.Addr, "-db", dsn, "-statement", "statement:account-7:2026-09",
			"-key", key, "-ttl", "2s", "-publish-window", window.String())
	}
	first := worker("statements/7/first.pdf", 2*time.Second)
	out, err := first.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Process.Signal(syscall.SIGCONT); _ = first.Process.Kill() }()
	scanner := bufio.NewScanner(out)
	var transcript []string
	for scanner.Scan() {
		transcript = append(transcript, scanner.Text())
		if strings.HasPrefix(scanner.Text(), "checked token") {
			break
		}
	}
	if err := first.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	client, err := baton.New(server.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	if _, err := client.Fence(ctx, "statement:account-7:2026-09"); err != nil {
		t.Fatal(err)
	}
	second, err := worker("statements/7/second.pdf", 0).CombinedOutput()
	if err != nil || !strings.Contains(string(second), "published statements/7/second.pdf") {
		t.Fatalf("the second worker publishes: %v: %s", err, second)
	}
	if err := first.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	for scanner.Scan() {
		transcript = append(transcript, scanner.Text())
	}
	err = first.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 4 {
		t.Fatalf("the paused worker exits 4: %v\n%s", err, strings.Join(transcript, "\n"))
	}
	if last := transcript[len(transcript)-1]; !strings.Contains(last, "not published: stale") {
		t.Fatalf("it says why: %q", last)
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	g, _, err := fence.GenerationOf(ctx, fence.SQL(db), "statement:account-7:2026-09")
	if err != nil || g.PublishedKey != "statements/7/second.pdf" {
		t.Fatalf("the statement keeps the second worker's object: %+v, %v", g, err)
	}
	t.Logf("paused worker:\n%s\nsecond worker:\n%s", strings.Join(transcript, "\n"), second)
	_ = os.Remove(bin)
}
