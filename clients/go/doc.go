// Package lockservice is the Go client of lockservice, a distributed lock
// service with fencing tokens.
//
// A Client keeps persistent connections to the nodes of one cluster (two
// when given a single address), pipelines requests over them round-robin,
// redials a connection that is down every 3 s in the background, and
// follows the standbys' redirects to the active node:
//
//	client, err := lockservice.Dial(ctx, []string{"10.0.0.1:7700", "10.0.0.2:7700"},
//		lockservice.WithName("billing"))
//	lock, err := client.Acquire(ctx, "orders/42", lockservice.AcquireOptions{
//		Lease: 30 * time.Second, Wait: 5 * time.Second, KeepAlive: true})
//	// ... write to the resource with lock.Token() as the fencing token,
//	// and stop when <-lock.Lost() fires ...
//	err = lock.Release(ctx)
//
// Every call takes a context. Cancelling an acquire's context withdraws the
// request from the server's queue ("C key") and releases a grant that
// crossed the withdrawal, so abandoned acquires never leak a lock.
//
// Keys may be shared (Read locks, semaphores), observed (Observe, Holder,
// WaitChange), and used for leader election (Campaign, Leader,
// Leadership.Resign). Errors are *Error values matched with errors.Is
// against ErrTimeout, ErrStale, ErrRejected, ErrNoConnection, ErrInvalid,
// ErrCancelled and ErrLost.
//
// The wire protocol and the behaviour every official client shares are in
// the lockservice repository's docs/protocol.md.
package lockservice
