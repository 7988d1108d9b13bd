// statement_worker is the seed's statement service worker in Go: it
// takes the lease of one statement, reads the statement's generation,
// renders it, checks it still holds the lease, and publishes the
// rendered object through the fence kit with its token, in one
// transaction. A worker that was paused past its lease (GC, SIGSTOP, a
// frozen VM) and publishes late is refused where the data is written.
//
//	statement_worker -server 127.0.0.1:7700 -db 'host=... dbname=app' \
//	    -statement statement:account-7:2026-09 -key statements/7/2026-09.pdf
//
// Exit codes: 0 published (or published before: a replay), 3 the lease
// is held by another worker, 4 not published (ownership lost, or the
// fence kit refused a stale token), 1 anything else.
package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	baton "github.com/baton-dev/baton/clients/go"
	"github.com/baton-dev/baton/clients/go/fence"
)

func main() {
	server := flag.String("server", "", "Baton server(s) (default BATON_SERVER, else 127.0.0.1:7700)")
	dsn := flag.String("db", "", "PostgreSQL connection string of the database with the fence kit")
	statement := flag.String("statement", "", "the statement's resource name")
	key := flag.String("key", "", "the rendered object's key")
	ttl := flag.Duration("ttl", 30*time.Second, "the lease's TTL")
	render := flag.Duration("render", 100*time.Millisecond, "how long rendering takes")
	window := flag.Duration("publish-window", 0, "a pause between the last check and the publish (for the stale-worker drill)")
	flag.Parse()
	os.Exit(run(*server, *dsn, *statement, *key, *ttl, *render, *window))
}

func run(server, dsn, statement, key string, ttl, render, window time.Duration) int {
	ctx := context.Background()
	client, err := baton.New(server, baton.WithHolder(fmt.Sprintf("statement_worker pid %d", os.Getpid())))
	if err != nil {
		fmt.Fprintln(os.Stderr, "statement_worker:", err)
		return 1
	}
	defer client.Close()
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, "statement_worker:", err)
		return 1
	}
	defer db.Close()
	lease, err := client.Acquire(ctx, statement, baton.WithTTL(ttl))
	if errors.Is(err, baton.ErrNotAcquired) {
		fmt.Println("not acquired:", err)
		return 3
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "statement_worker:", err)
		return 1
	}
	kept := client.Keep(ctx, lease)
	defer func() { _ = kept.Release(context.Background()) }()
	fmt.Println("acquired token", lease.Token)
	g, _, err := fence.GenerationOf(ctx, fence.SQL(db), statement)
	if err != nil {
		fmt.Fprintln(os.Stderr, "statement_worker:", err)
		return 1
	}
	fmt.Println("generation", g.Generation, "published", g.PublishedKey)
	select { // rendering, stopped the moment ownership is uncertain
	case <-time.After(render):
	case <-kept.Context().Done():
		fmt.Println("not published:", kept.Err())
		return 4
	}
	if err := kept.Err(); err != nil {
		fmt.Println("not published:", err)
		return 4
	}
	fmt.Println("checked token", kept.Token())
	time.Sleep(window)
	return publish(ctx, db, statement, kept.Token(), key)
}

// publish moves the statement's pointer to key under token, in one
// transaction committed only when the fence kit applied it.
func publish(ctx context.Context, db *sql.DB, statement string, token uint64, key string) int {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, "statement_worker:", err)
		return 1
	}
	defer func() { _ = tx.Rollback() }()
	fingerprint := sha256.Sum256([]byte(key))
	d, err := fence.Publish(ctx, fence.SQL(tx), statement, token, "publish "+key, fingerprint[:], key)
	if err != nil {
		fmt.Fprintln(os.Stderr, "statement_worker:", err)
		return 1
	}
	if !d.OK() {
		fmt.Printf("not published: %s (token %d; the statement is at token %d)\n", d.Outcome, token, d.CurrentToken)
		return 4
	}
	if err := tx.Commit(); err != nil {
		fmt.Fprintln(os.Stderr, "statement_worker:", err)
		return 1
	}
	fmt.Println("published", key, "token", token, d.Outcome)
	return 0
}
