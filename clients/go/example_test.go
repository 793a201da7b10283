package lockservice_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log"
	"os"
	"testing"
	"time"

	lockservice "github.com/lockservice/lockservice/clients/go"
	"github.com/lockservice/lockservice/clients/go/internal/fakeserver"
)

// TestMain runs the examples against an in-process fake node, whose
// address they read from LOCKSERVICE_ADDR.
func TestMain(m *testing.M) {
	s, err := fakeserver.Start(nil)
	if err != nil {
		panic(err)
	}
	os.Setenv("LOCKSERVICE_ADDR", s.Addr)
	code := m.Run()
	s.Close()
	os.Exit(code)
}

// The whole cycle: connect, lock, work under the fencing token, release.
func Example() {
	ctx := context.Background()
	addr := os.Getenv("LOCKSERVICE_ADDR") // e.g. "127.0.0.1:7700"
	client, err := lockservice.Dial(ctx, []string{addr}, lockservice.WithName("billing"))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	lock, err := client.Acquire(ctx, "orders/42", lockservice.AcquireOptions{
		Lease: 30 * time.Second, // the server takes the key back after this
		Wait:  5 * time.Second,  // give up if not granted within this
	})
	if err != nil {
		log.Fatal(err)
	}
	// Give lock.Token() to the protected resource with every write, so it
	// can refuse a late writer with a smaller token.
	fmt.Println("holding", lock.Key(), "token > 0:", lock.Token() > 0)

	if err := lock.Release(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("released")
	// Output:
	// holding orders/42 token > 0: true
	// released
}

// Dial with every node of a cluster: the client follows the standbys'
// redirects to the active node and moves on when it fails.
func ExampleDial() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr := os.Getenv("LOCKSERVICE_ADDR") // in production: every node, "10.0.0.1:7700", ...
	client, err := lockservice.Dial(ctx, []string{addr}, lockservice.WithName("reports"))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	fmt.Println("connected")
	// Output: connected
}

func ExampleClient_Acquire() {
	ctx := context.Background()
	client, _ := lockservice.Dial(ctx, []string{os.Getenv("LOCKSERVICE_ADDR")})
	defer client.Close()

	lock, err := client.Acquire(ctx, "invoices/7", lockservice.AcquireOptions{
		Lease: 10 * time.Second,
		Wait:  2 * time.Second,
	})
	switch {
	case errors.Is(err, lockservice.ErrTimeout):
		fmt.Println("someone else holds it; try later")
		return
	case err != nil:
		log.Fatal(err)
	}
	defer lock.Release(ctx)
	fmt.Println("acquired", lock.Key())
	// Output: acquired invoices/7
}

// Cancelling an acquire's context withdraws it from the server's queue; a
// grant that crossed the withdrawal is released, so nothing leaks.
func ExampleClient_Acquire_cancel() {
	ctx := context.Background()
	client, _ := lockservice.Dial(ctx, []string{os.Getenv("LOCKSERVICE_ADDR")})
	defer client.Close()
	holder, _ := client.Acquire(ctx, "batch", lockservice.AcquireOptions{Lease: time.Minute})
	defer holder.Release(ctx)

	waitCtx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err := client.Acquire(waitCtx, "batch", lockservice.AcquireOptions{Lease: time.Minute})
	fmt.Println(errors.Is(err, lockservice.ErrCancelled), errors.Is(err, context.DeadlineExceeded))
	// Output: true true
}

// Read locks share a key with other readers, never with a writer;
// semaphores admit n holders.
func ExampleClient_Acquire_shared() {
	ctx := context.Background()
	client, _ := lockservice.Dial(ctx, []string{os.Getenv("LOCKSERVICE_ADDR")})
	defer client.Close()

	r1, _ := client.Acquire(ctx, "catalog", lockservice.AcquireOptions{Lease: time.Minute, Share: lockservice.Read})
	r2, _ := client.Acquire(ctx, "catalog", lockservice.AcquireOptions{Lease: time.Minute, Share: lockservice.Read})
	fmt.Println("two readers:", r1 != nil && r2 != nil)
	r1.Release(ctx)
	r2.Release(ctx)

	slot, err := client.Acquire(ctx, "gpu", lockservice.AcquireOptions{Lease: time.Minute, Share: lockservice.Semaphore(4)})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("one of", slot.Share(), "slots")
	slot.Release(ctx)
	// Output:
	// two readers: true
	// one of 4 slots
}

func ExampleLock_Release() {
	ctx := context.Background()
	client, _ := lockservice.Dial(ctx, []string{os.Getenv("LOCKSERVICE_ADDR")})
	defer client.Close()
	lock, _ := client.Acquire(ctx, "jobs/1", lockservice.AcquireOptions{Lease: time.Minute})

	// Retried for 5 s across dropped connections and failovers.
	err := lock.Release(ctx)
	fmt.Println("released:", err == nil)
	// Releasing again says the token no longer holds the key.
	err = lock.Release(ctx)
	fmt.Println("stale:", errors.Is(err, lockservice.ErrStale))
	// Output:
	// released: true
	// stale: true
}

func ExampleLock_Renew() {
	ctx := context.Background()
	client, _ := lockservice.Dial(ctx, []string{os.Getenv("LOCKSERVICE_ADDR")})
	defer client.Close()
	lock, _ := client.Acquire(ctx, "jobs/2", lockservice.AcquireOptions{Lease: 10 * time.Second})
	defer lock.Release(ctx)

	// The lease now runs 30 s from the renewal; the token stays the same.
	if err := lock.Renew(ctx, 30*time.Second); err != nil {
		log.Fatal(err)
	}
	fmt.Println("renewed for", lock.Lease())
	// Output: renewed for 30s
}

// With KeepAlive the client renews every third of the lease; Lost fires if
// it can no longer be sure it holds the lock: stop working then.
func ExampleLock_Lost() {
	ctx := context.Background()
	client, _ := lockservice.Dial(ctx, []string{os.Getenv("LOCKSERVICE_ADDR")})
	defer client.Close()
	lock, err := client.Acquire(ctx, "reindex", lockservice.AcquireOptions{
		Lease:     3 * time.Second,
		KeepAlive: true,
	})
	if err != nil {
		log.Fatal(err)
	}
	defer lock.Release(ctx)

	work := time.After(100 * time.Millisecond) // the job
	select {
	case <-lock.Lost():
		fmt.Println("lost the lock, stopping:", lock.Err())
	case <-work:
		fmt.Println("work done under the lock")
	}
	// Output: work done under the lock
}

func ExampleClient_Observe() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client, _ := lockservice.Dial(ctx, []string{os.Getenv("LOCKSERVICE_ADDR")}, lockservice.WithName("web-1"))
	defer client.Close()

	obs, err := client.Observe(ctx, "orders/99")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("held:", (<-obs.C).Held())

	lock, _ := client.Acquire(ctx, "orders/99", lockservice.AcquireOptions{Lease: time.Minute})
	st := <-obs.C
	fmt.Println("held by", st.Value(), "token matches:", st.Token == lock.Token())

	lock.Release(ctx)
	fmt.Println("held:", (<-obs.C).Held())
	// Output:
	// held: false
	// held by web-1 token matches: true
	// held: false
}

func ExampleClient_Campaign() {
	ctx := context.Background()
	client, _ := lockservice.Dial(ctx, []string{os.Getenv("LOCKSERVICE_ADDR")})
	defer client.Close()

	// Returns once this process leads (keep-alive on).
	lead, err := client.Campaign(ctx, "scheduler", "10.0.0.7:8080", 10*time.Second)
	if err != nil {
		log.Fatal(err)
	}
	defer lead.Resign(ctx)
	// Fence the leader's writes with lead.Token(); stop at <-lead.Lost().
	fmt.Println("leading", lead.Election(), "as", lead.Value())

	// Output: leading scheduler as 10.0.0.7:8080
}

func ExampleClient_Leader() {
	ctx := context.Background()
	client, _ := lockservice.Dial(ctx, []string{os.Getenv("LOCKSERVICE_ADDR")})
	defer client.Close()
	lead, _ := client.Campaign(ctx, "ingest", "worker-3", 10*time.Second)

	leader, err := client.Leader(ctx, "ingest")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("leader:", leader.Value, "fenced by its token:", leader.Token == lead.Token())

	lead.Resign(ctx)
	leader, _ = client.Leader(ctx, "ingest")
	fmt.Println("nobody leads:", leader.Token == 0)
	// Output:
	// leader: worker-3 fenced by its token: true
	// nobody leads: true
}

func ExampleLeadership_Resign() {
	ctx := context.Background()
	client, _ := lockservice.Dial(ctx, []string{os.Getenv("LOCKSERVICE_ADDR")})
	defer client.Close()
	lead, _ := client.Campaign(ctx, "compactor", "node-a", 10*time.Second)
	fmt.Println("resigned:", lead.Resign(ctx) == nil)
	// Output: resigned: true
}

// TLS: verify the nodes against your CA; present a client certificate when
// the nodes require one (mutual TLS, the server's --tls-ca).
func ExampleWithTLS() {
	caPEM, err := os.ReadFile("ca.pem")
	if err != nil {
		log.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	cert, err := tls.LoadX509KeyPair("client.pem", "client-key.pem")
	if err != nil {
		log.Fatal(err)
	}
	client, err := lockservice.Dial(context.Background(), []string{"10.0.0.1:7700", "10.0.0.2:7700"},
		lockservice.WithTLS(&tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}}))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
}

func ExampleClient_WaitChange() {
	ctx := context.Background()
	client, _ := lockservice.Dial(ctx, []string{os.Getenv("LOCKSERVICE_ADDR")})
	defer client.Close()
	// Wait at most 100 ms for "cron" to be taken (its newest token is 0).
	st, err := client.WaitChange(ctx, "cron", 0, 100*time.Millisecond)
	fmt.Println(errors.Is(err, lockservice.ErrTimeout), st.Held())
	// Output: true false
}
