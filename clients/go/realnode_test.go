package lockservice

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/lockservice/lockservice/clients/go/internal/testcerts"
	"github.com/lockservice/lockservice/clients/go/internal/testnode"
)

// Tests against real nodes: they need LOCKSERVICE_TWISTD (a twistd with
// the lockservice plugin) and skip without it.

func TestRealLoneNode(t *testing.T) {
	n := testnode.Lone(t, testnode.Options{}, nil)
	ctx := ctxT(t)
	c1 := dialT(t, []string{n.Addr}, WithName("one"))
	c2 := dialT(t, []string{n.Addr}, WithName("two"))
	l1, err := c1.Acquire(ctx, "k", AcquireOptions{Lease: 30 * time.Second, Wait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *Lock, 1)
	go func() {
		l, err := c2.Acquire(ctx, "k", AcquireOptions{Lease: 30 * time.Second, Wait: 10 * time.Second})
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	// Let the second acquire queue, then hand over.
	waitFor(t, func() bool {
		_, err := c1.Acquire(ctx, "k", AcquireOptions{Lease: time.Second, Wait: time.Millisecond})
		return errors.Is(err, ErrTimeout)
	})
	if err := l1.Renew(ctx, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := <-got
	if l2 == nil || l2.Token() <= l1.Token() {
		t.Fatalf("handover: %v after %v", l2, l1)
	}
	if err := l1.Release(ctx); !errors.Is(err, ErrStale) {
		t.Fatalf("stale release: %v", err)
	}
	if err := c1.RenewToken(ctx, "k", l1.Token(), time.Second); !errors.Is(err, ErrStale) {
		t.Fatalf("stale renew: %v", err)
	}
	if _, err := c1.Acquire(ctx, "k", AcquireOptions{Lease: time.Second, Wait: 200 * time.Millisecond}); !errors.Is(err, ErrTimeout) {
		t.Fatalf("timeout: %v", err)
	}
	if _, err := c1.Acquire(ctx, "k", AcquireOptions{Lease: time.Second, Wait: time.Second, Share: Semaphore(3)}); !errors.Is(err, ErrRejected) {
		t.Fatalf("kind mismatch: %v", err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Readers share; a semaphore of 2 takes two.
	r1, err := c1.Acquire(ctx, "rw", AcquireOptions{Lease: 10 * time.Second, Wait: time.Second, Share: Read})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c2.Acquire(ctx, "rw", AcquireOptions{Lease: 10 * time.Second, Wait: time.Second, Share: Read})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Acquire(ctx, "rw", AcquireOptions{Lease: 10 * time.Second, Wait: 200 * time.Millisecond}); !errors.Is(err, ErrTimeout) {
		t.Fatalf("writer beside readers: %v", err)
	}
	r1.Release(ctx)
	r2.Release(ctx)
	for i := 0; i < 2; i++ {
		if _, err := c1.Acquire(ctx, "sem", AcquireOptions{Lease: 10 * time.Second, Wait: time.Second, Share: Semaphore(2)}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c1.Acquire(ctx, "sem", AcquireOptions{Lease: 10 * time.Second, Wait: 200 * time.Millisecond, Share: Semaphore(2)}); !errors.Is(err, ErrTimeout) {
		t.Fatalf("third slot: %v", err)
	}
	// Keep-alive outlives its lease.
	ka, err := c1.Acquire(ctx, "ka", AcquireOptions{Lease: 600 * time.Millisecond, KeepAlive: true})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-ka.Lost():
		t.Fatalf("kept-alive lock lost: %v", ka.Err())
	case <-time.After(1500 * time.Millisecond):
	}
	if err := ka.Release(ctx); err != nil {
		t.Fatalf("release after keep-alive: %v", err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestRealWithdrawOnCancel(t *testing.T) {
	n := testnode.Lone(t, testnode.Options{}, nil)
	ctx := ctxT(t)
	c1 := dialT(t, []string{n.Addr})
	c2 := dialT(t, []string{n.Addr})
	c3 := dialT(t, []string{n.Addr})
	held, err := c1.Acquire(ctx, "k", AcquireOptions{Lease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := c2.Acquire(actx, "k", AcquireOptions{Lease: 30 * time.Second})
		done <- err
	}()
	time.Sleep(200 * time.Millisecond) // let it queue (the outcome below does not depend on it)
	cancel()
	if err := <-done; !errors.Is(err, ErrCancelled) {
		t.Fatalf("cancel: %v", err)
	}
	// The withdrawn waiter left the queue though its connection is open:
	// after the release the key goes to the next acquire, at once.
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c3.Acquire(ctx, "k", AcquireOptions{Lease: 30 * time.Second, Wait: 2 * time.Second}); err != nil {
		t.Fatalf("key not free after the withdrawal (needs C): %v", err)
	}
}

func TestRealObserve(t *testing.T) {
	n := testnode.Lone(t, testnode.Options{}, nil)
	ctx := ctxT(t)
	c := dialT(t, []string{n.Addr}, WithName("watcher"))
	h := dialT(t, []string{n.Addr}, WithName("holder"))
	octx, cancel := context.WithCancel(ctx)
	defer cancel()
	o, err := c.Observe(octx, "k")
	if err != nil {
		t.Fatal(err)
	}
	next := func() State {
		select {
		case st, ok := <-o.C:
			if !ok {
				t.Fatalf("observer ended (needs O): %v", o.Err())
			}
			return st
		case <-time.After(bound):
			t.Fatal("no state")
		}
		return State{}
	}
	if st := next(); st.Held() {
		t.Fatalf("first state %+v", st)
	}
	l, err := h.Acquire(ctx, "k", AcquireOptions{Lease: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	st := next()
	if st.Token != l.Token() || st.Value() != "holder" || !strings.HasPrefix(st.Holder, "holder#") {
		t.Fatalf("state %+v", st)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if st := next(); st.Held() {
		t.Fatalf("after release %+v", st)
	}
	if st, err := c.WaitChange(ctx, "k", 0, 300*time.Millisecond); !errors.Is(err, ErrTimeout) || st.Held() {
		t.Fatalf("WaitChange %+v %v", st, err)
	}
}

func TestRealElection(t *testing.T) {
	n := testnode.Lone(t, testnode.Options{}, nil)
	ctx := ctxT(t)
	a := dialT(t, []string{n.Addr}, WithName("app"))
	b := dialT(t, []string{n.Addr}, WithName("app"))
	la, err := a.Campaign(ctx, "leader", "alpha", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	ld, err := b.Leader(ctx, "leader")
	if err != nil || ld.Value != "alpha" || ld.Token != la.Token() {
		t.Fatalf("leader %+v %v (needs O and names at grant time)", ld, err)
	}
	won := make(chan *Leadership, 1)
	go func() {
		lb, err := b.Campaign(ctx, "leader", "beta", 5*time.Second)
		if err != nil {
			t.Error(err)
		}
		won <- lb
	}()
	time.Sleep(200 * time.Millisecond)
	if err := la.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	lb := <-won
	if lb == nil {
		t.FailNow()
	}
	ld, err = a.Leader(ctx, "leader")
	if err != nil || ld.Value != "beta" || ld.Token != lb.Token() {
		t.Fatalf("leader %+v %v", ld, err)
	}
	lb.Resign(ctx)
}

func TestRealClusterFailoverAndHandoff(t *testing.T) {
	nodes := testnode.Cluster(t, 3)
	addrs := []string{nodes[0].Addr, nodes[1].Addr, nodes[2].Addr}
	ctx := ctxT(t)
	c := dialT(t, addrs, WithName("cl"))
	// A client given only a standby is redirected to the active.
	viaStandby := dialT(t, []string{nodes[2].Addr})
	ls, err := viaStandby.Acquire(ctx, "s", AcquireOptions{Lease: 30 * time.Second, Wait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := ls.Release(ctx); err != nil {
		t.Fatal(err)
	}
	held, err := c.Acquire(ctx, "k1", AcquireOptions{Lease: 30 * time.Second, Wait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ka, err := c.Acquire(ctx, "ka", AcquireOptions{Lease: 3 * time.Second, KeepAlive: true})
	if err != nil {
		t.Fatal(err)
	}
	nodes[0].Kill()
	start := time.Now()
	l2, err := c.Acquire(ctx, "k2", AcquireOptions{Lease: 30 * time.Second, Wait: 10 * time.Second})
	if err != nil {
		t.Fatalf("acquire after kill -9 of the active: %v", err)
	}
	t.Logf("first grant after kill -9: %v", time.Since(start))
	if l2.Token() <= held.Token() {
		t.Fatalf("tokens went back: %d after %d", l2.Token(), held.Token())
	}
	// The grant was replicated: its release is OK on the new active.
	if err := held.Release(ctx); err != nil {
		t.Fatalf("release of a replicated grant: %v", err)
	}
	select {
	case <-ka.Lost():
		t.Fatalf("kept-alive lock lost in the failover: %v", ka.Err())
	default:
	}
	// Graceful handoff from node 1 to node 2.
	nodes[1].Term()
	start = time.Now()
	l3, err := c.Acquire(ctx, "k3", AcquireOptions{Lease: 30 * time.Second, Wait: 10 * time.Second})
	if err != nil {
		t.Fatalf("acquire after the handoff: %v", err)
	}
	t.Logf("first grant after the handoff: %v", time.Since(start))
	if err := l2.Release(ctx); err != nil {
		t.Fatalf("release after the handoff: %v", err)
	}
	if err := l3.Release(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // a renewal or two on the last node
	select {
	case <-ka.Lost():
		t.Fatalf("kept-alive lock lost: %v", ka.Err())
	default:
	}
	if err := ka.Release(ctx); err != nil {
		t.Fatalf("kept-alive release: %v", err)
	}
}

func TestRealTLS(t *testing.T) {
	certs, err := testcerts.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, mutual := range []bool{false, true} {
		opts := []string{"--tls-cert", certs.ServerCert, "--tls-key", certs.ServerKey}
		if mutual {
			opts = append(opts, "--tls-ca", certs.CAFile)
		}
		n := testnode.Lone(t, testnode.Options{TLS: opts}, certs.ClientConfig(true))
		c := dialT(t, []string{n.Addr}, WithTLS(certs.ClientConfig(mutual)))
		ctx := ctxT(t)
		l, err := c.Acquire(ctx, "k", AcquireOptions{Lease: 10 * time.Second, Wait: time.Second})
		if err != nil {
			t.Fatalf("mutual=%v: %v", mutual, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		bad := certs.ClientConfig(false)
		if !mutual {
			bad.RootCAs = nil // the system roots do not know the test CA
		}
		dctx, cancel := context.WithTimeout(ctx, bound)
		_, err = Dial(dctx, []string{n.Addr}, WithTLS(bad))
		cancel()
		if !errors.Is(err, ErrNoConnection) {
			t.Fatalf("mutual=%v: a client that should be refused connected: %v", mutual, err)
		}
		n.Stop()
	}
}

// A node that keeps its connections open but never answers (SIGSTOP) holds
// no call forever, and the client recovers when it answers again.
func TestRealPausedNode(t *testing.T) {
	n := testnode.Lone(t, testnode.Options{}, nil)
	ctx := ctxT(t)
	c := dialT(t, []string{n.Addr})
	l, err := c.Acquire(ctx, "k", AcquireOptions{Lease: 30 * time.Second, Wait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	n.Pause()
	defer n.Resume()
	start := time.Now()
	_, err = c.Acquire(ctx, "other", AcquireOptions{Lease: 30 * time.Second, Wait: time.Second})
	if !errors.Is(err, ErrTimeout) && !errors.Is(err, ErrNoConnection) {
		t.Fatalf("acquire on a paused node: %v", err)
	}
	if el := time.Since(start); el > 4*time.Second {
		t.Fatalf("acquire with wait 1 s ended after %v", el)
	}
	start = time.Now()
	if err := l.Release(ctx); !errors.Is(err, ErrNoConnection) {
		t.Fatalf("release on a paused node: %v", err)
	}
	if el := time.Since(start); el > ReleaseRetryFor+time.Second {
		t.Fatalf("release ended after %v", el)
	}
	n.Resume()
	l2, err := c.Acquire(ctx, "again", AcquireOptions{Lease: 30 * time.Second, Wait: 10 * time.Second})
	if err != nil {
		t.Fatalf("after resume: %v", err)
	}
	l2.Release(ctx)
}
