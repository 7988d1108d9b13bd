package batonlock

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"k8s.io/client-go/tools/leaderelection"

	baton "github.com/baton-dev/baton/clients/go"
	"github.com/baton-dev/baton/clients/go/batontest"
	"github.com/baton-dev/baton/clients/go/fence"
)

// TestMain runs a candidate process when the multi-process test starts
// this binary as one.
func TestMain(m *testing.M) {
	if id := os.Getenv("BATONLOCK_CANDIDATE"); id != "" {
		os.Exit(candidate(id))
	}
	os.Exit(m.Run())
}

// candidate runs client-go's LeaderElector on a Baton lock and, while it
// leads, writes through the fence kit with its token: it prints
// "checked TOKEN", waits 300 ms (the window a pause lands in), then
// writes and prints "wrote TOKEN OUTCOME".
func candidate(id string) int {
	ctx := context.Background()
	client, err := baton.New(os.Getenv("BATON_SERVER"))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	db, err := sql.Open("pgx", os.Getenv("BATONLOCK_DSN"))
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	lock, err := New(client, "k8s:controller", "candidate-"+id)
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond,
		RetryPeriod: 100 * time.Millisecond, Name: "baton-process-test",
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				for seq := uint64(1); ctx.Err() == nil; seq++ {
					token, ok := lock.Token()
					if !ok {
						time.Sleep(50 * time.Millisecond)
						continue
					}
					fmt.Println("checked", token)
					time.Sleep(300 * time.Millisecond)
					d, err := fence.Fence(context.Background(), fence.SQL(db), "k8s:reconciled", token,
						fmt.Sprintf("write %s %d", id, seq), []byte(id), fence.Options{Policy: "ordered", Seq: seq})
					if err != nil {
						fmt.Println("error", err)
						continue
					}
					fmt.Println("wrote", token, d.Outcome)
				}
			},
			OnStoppedLeading: func() { fmt.Println("stopped") },
		},
	})
	return 0
}

type line struct {
	candidate int
	words     []string
}

// Three candidate processes: the leader is SIGSTOPped between its check
// and its write, past its lease; another leads with a higher token and
// writes; the old one, resumed, writes with its old token and the fence
// kit refuses it as stale. Then the leader is SIGKILLed and another leads.
func TestAPausedLeaderProcessIsFencedAndAKilledOneReplaced(t *testing.T) {
	server := batontest.Start(t)
	dsn := batontest.FenceKitDatabase(t)
	lines := make(chan line, 256)
	procs := make([]*exec.Cmd, 3)
	for i := range procs {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), "BATONLOCK_CANDIDATE="+strconv.Itoa(i), "BATON_SERVER="+server.Addr, "BATONLOCK_DSN="+dsn)
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs[i] = cmd
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGCONT)
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		go func() {
			scanner := bufio.NewScanner(out)
			for scanner.Scan() {
				lines <- line{candidate: i, words: strings.Fields(scanner.Text())}
			}
		}()
	}
	await := func(what string, match func(line) bool) line {
		t.Helper()
		timeout := time.After(20 * time.Second)
		for {
			select {
			case l := <-lines:
				if len(l.words) > 0 && l.words[0] == "error" {
					t.Fatalf("candidate %d: %v", l.candidate, l.words)
				}
				if match(l) {
					return l
				}
			case <-timeout:
				t.Fatalf("no %s within 20 s", what)
			}
		}
	}
	token := func(l line) uint64 { n, _ := strconv.ParseUint(l.words[1], 10, 64); return n }
	checked := await("leader's check", func(l line) bool { return l.words[0] == "checked" })
	old, oldToken := checked.candidate, token(checked)
	// Paused between its check and its write, past its 2 s lease.
	if err := procs[old].Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now()
	wrote := await("new leader's write", func(l line) bool {
		return l.candidate != old && l.words[0] == "wrote" && token(l) > oldToken && l.words[2] == string(fence.Applied)
	})
	newLeader, newToken := wrote.candidate, token(wrote)
	time.Sleep(max(0, 3*time.Second-time.Since(stoppedAt)))
	if err := procs[old].Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	late := await("the old leader's late write", func(l line) bool { return l.candidate == old && l.words[0] == "wrote" })
	if token(late) != oldToken || late.words[2] != string(fence.Stale) {
		t.Fatalf("the resumed leader's write with token %d: %v", oldToken, late.words)
	}
	// The leader killed: another is elected above it.
	if err := procs[newLeader].Process.Kill(); err != nil {
		t.Fatal(err)
	}
	third := await("a leader after the kill", func(l line) bool {
		return l.candidate != newLeader && l.words[0] == "wrote" && token(l) > newToken && l.words[2] == string(fence.Applied)
	})
	t.Logf("candidate %d (token %d) paused past its lease: its late write refused as stale; candidate %d led (token %d), killed; candidate %d leads (token %d)",
		old, oldToken, newLeader, newToken, third.candidate, token(third))
}
