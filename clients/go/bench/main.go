// The Go client's benchmark: acquire → release cycles per second at
// several goroutine counts, each goroutine on a resource of its own, for
// the Go client (unary calls, and sessions: one per goroutine on one
// connection), etcd's Go client (concurrency.Mutex, a session per
// goroutine) and, given the baton binary, the Rust client's `baton bench
// --session` on the same server; targets alternate within each round,
// and medians and same-round ratios are printed. Figures for people: no
// test asserts on them. scripts/bench-go starts the servers and runs it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	baton "github.com/baton-dev/baton/clients/go"
)

type target struct {
	name string
	// run cycles with c goroutines for d and returns cycles/s.
	run func(c int, d time.Duration, round int) (float64, error)
}

func main() {
	batonAddr := flag.String("baton", "127.0.0.1:7700", "Baton server")
	etcdAddr := flag.String("etcd", "", "etcd endpoint (empty: skip)")
	batonBin := flag.String("baton-bin", "", "the baton binary, to run the Rust client's `baton bench --session` (empty: skip)")
	clientsFlag := flag.String("clients", "1,16,64", "goroutine counts")
	duration := flag.Duration("duration", 3*time.Second, "time per measurement")
	rounds := flag.Int("rounds", 3, "rounds (medians are printed)")
	only := flag.String("only", "", "run only the targets whose names contain this")
	cpuProfile := flag.String("cpuprofile", "", "write this process's CPU profile here")
	memProfile := flag.String("memprofile", "", "write this process's allocation profile here at the end")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	if *memProfile != "" {
		defer writeAllocs(*memProfile)
	}
	var counts []int
	for _, p := range strings.Split(*clientsFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(p))
		if err != nil || n < 1 || n > 4096 {
			fmt.Fprintf(os.Stderr, "-clients: %q is not a count from 1 to 4096\n", p)
			os.Exit(2)
		}
		counts = append(counts, n)
	}
	targets := []target{goUnary(*batonAddr), goSession(*batonAddr)}
	if *batonBin != "" {
		targets = append(targets, rustSession(*batonBin, *batonAddr))
	}
	if *etcdAddr != "" {
		targets = append(targets, etcdMutex(*etcdAddr))
	}
	targets = slices.DeleteFunc(targets, func(t target) bool { return !strings.Contains(t.name, *only) })
	figures := map[string][]float64{} // target|C -> per round
	for round := 1; round <= *rounds; round++ {
		for _, c := range counts {
			for _, t := range targets {
				v, err := t.run(c, *duration, round)
				if err != nil {
					fmt.Fprintf(os.Stderr, "%s C=%d: %v\n", t.name, c, err)
					return
				}
				key := t.name + "|" + strconv.Itoa(c)
				figures[key] = append(figures[key], v)
				fmt.Printf("round %d  %-22s C=%-3d %9.0f cycles/s\n", round, t.name, c, v)
			}
		}
	}
	fmt.Printf("\nmedians of %d rounds (cycles/s)\n%-22s", *rounds, "target")
	for _, c := range counts {
		fmt.Printf(" %10s", "C="+strconv.Itoa(c))
	}
	fmt.Println()
	for _, t := range targets {
		fmt.Printf("%-22s", t.name)
		for _, c := range counts {
			fmt.Printf(" %10.0f", median(figures[t.name+"|"+strconv.Itoa(c)]))
		}
		fmt.Println()
	}
	fmt.Println("\nmedian same-round ratios")
	for _, pair := range [][2]string{{"go session", "etcd mutex"}, {"go unary", "etcd mutex"}, {"go session", "rust session"}} {
		a, b := figures[pair[0]+"|"+strconv.Itoa(counts[0])], figures[pair[1]+"|"+strconv.Itoa(counts[0])]
		if a == nil || b == nil {
			continue
		}
		fmt.Printf("%-22s", pair[0]+" / "+pair[1])
		for _, c := range counts {
			x, y := figures[pair[0]+"|"+strconv.Itoa(c)], figures[pair[1]+"|"+strconv.Itoa(c)]
			ratios := make([]float64, len(x))
			for i := range x {
				ratios[i] = x[i] / max(y[i], 1e-9)
			}
			fmt.Printf(" %10.2f", median(ratios))
		}
		fmt.Println()
	}
}

// writeAllocs writes the allocation profile of the run to path.
func writeAllocs(path string) {
	f, err := os.Create(path)
	if err == nil {
		err = pprof.Lookup("allocs").WriteTo(f, 0)
		f.Close()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
	}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	sort.Float64s(s)
	return s[len(s)/2]
}

// cycle runs c goroutines, each calling one(i) until d passed, and
// returns completed calls per second.
func cycle(c int, d time.Duration, one func(i int) error) (float64, error) {
	var done atomic.Int64
	var first atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	deadline := start.Add(d)
	for i := range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				if err := one(i); err != nil {
					first.CompareAndSwap(nil, err)
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	if err, ok := first.Load().(error); ok {
		return 0, err
	}
	return float64(done.Load()) / time.Since(start).Seconds(), nil
}

// resourceNames is a resource per goroutine, named once before the
// cycles (as the Rust client's bench does).
func resourceNames(prefix string, round, c int) []string {
	names := make([]string, c)
	for i := range names {
		names[i] = fmt.Sprintf("%s:%d:%d:%d", prefix, round, c, i)
	}
	return names
}

func goUnary(addr string) target {
	return target{"go unary", func(c int, d time.Duration, round int) (float64, error) {
		client, err := baton.New(addr)
		if err != nil {
			return 0, err
		}
		defer client.Close()
		ctx := context.Background()
		names := resourceNames("bench:go:unary", round, c)
		return cycle(c, d, func(i int) error {
			l, err := client.Acquire(ctx, names[i], baton.WithTTL(30*time.Second))
			if err != nil {
				return err
			}
			_, err = client.Release(ctx, l)
			return err
		})
	}}
}

func goSession(addr string) target {
	return target{"go session", func(c int, d time.Duration, round int) (float64, error) {
		client, err := baton.New(addr)
		if err != nil {
			return 0, err
		}
		defer client.Close()
		ctx := context.Background()
		sessions := make([]*baton.Session, c)
		for i := range sessions {
			if sessions[i], err = client.OpenSession(ctx, 30*time.Second); err != nil {
				return 0, err
			}
			defer sessions[i].Close(ctx)
		}
		names := resourceNames("bench:go:session", round, c)
		return cycle(c, d, func(i int) error {
			l, err := sessions[i].Acquire(ctx, names[i])
			if err != nil {
				return err
			}
			_, err = sessions[i].Release(ctx, l)
			return err
		})
	}}
}

func rustSession(bin, addr string) target {
	return target{"rust session", func(c int, d time.Duration, round int) (float64, error) {
		out, err := exec.Command(bin, "bench", "--server", addr, "--clients", strconv.Itoa(c), "--modes", "distinct",
			"--duration", d.String(), "--session", "--json").Output()
		if err != nil {
			return 0, fmt.Errorf("baton bench: %w", err)
		}
		var report struct {
			Runs []struct {
				CyclesPerS float64 `json:"cycles_per_s"`
			} `json:"runs"`
		}
		if err := json.Unmarshal(out, &report); err != nil || len(report.Runs) != 1 {
			return 0, fmt.Errorf("baton bench printed %q: %v", out, err)
		}
		return report.Runs[0].CyclesPerS, nil
	}}
}

func etcdMutex(endpoint string) target {
	return target{"etcd mutex", func(c int, d time.Duration, round int) (float64, error) {
		client, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
		if err != nil {
			return 0, err
		}
		defer client.Close()
		mutexes := make([]*concurrency.Mutex, c)
		for i := range mutexes {
			session, err := concurrency.NewSession(client, concurrency.WithTTL(30))
			if err != nil {
				return 0, err
			}
			defer session.Close()
			mutexes[i] = concurrency.NewMutex(session, fmt.Sprintf("/bench/%d/%d/%d", round, c, i))
		}
		ctx := context.Background()
		return cycle(c, d, func(i int) error {
			if err := mutexes[i].Lock(ctx); err != nil {
				return err
			}
			return mutexes[i].Unlock(ctx)
		})
	}}
}
