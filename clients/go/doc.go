// Package baton is the Go client of Baton, a lease service that hands out
// fencing tokens: a worker acquires a lease on a resource name, carries
// the lease's token into every write it makes, and the resource refuses a
// write whose token is older than one it has seen.
//
//	client, err := baton.New("127.0.0.1:7700")
//	if err != nil { ... }
//	defer client.Close()
//	lease, err := client.Acquire(ctx, "statement:42", baton.WithTTL(30*time.Second))
//	if errors.Is(err, baton.ErrNotAcquired) { ... }  // held by another
//	publish(ctx, ..., lease.Token)                   // the resource checks it
//	_, err = client.Release(ctx, lease)
//
// This release has the unary calls (acquire, renew, release, status,
// list, fence) with the other clients' rules: names, holders and
// durations checked before anything is sent, calls sent to the leader of
// a cluster, an acquire whose answer was lost sent again under the same
// request id (never a second lease), and every error either definite or
// [ErrIndeterminate]. A lease's ValidUntil counts from the moment its
// request was sent, on this process's monotonic clock, and a [Keeper]
// renews a lease and gives it up at its safe-until on that clock, whether
// or not the server answers. A [Session] is one stream that many leases
// share, resumed on the leader while its safe-until lasts, and a
// [SessionKeeper] follows a lease on it; [Client.Watch] and
// [Client.Election] watch holders and elect a fenced leader.
package baton
