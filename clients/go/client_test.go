package lockservice

import (
	"context"
	"errors"
	"math"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockservice/lockservice/clients/go/internal/fakeserver"
	"github.com/lockservice/lockservice/clients/go/internal/testcerts"
)

const bound = 10 * time.Second

func startFake(t *testing.T) *fakeserver.Server {
	t.Helper()
	s, err := fakeserver.Start(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func dialT(t *testing.T, addrs []string, opts ...Option) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	c, err := Dial(ctx, addrs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	// Every connection up, so that tests see the round-robin they expect.
	deadline := time.Now().Add(bound)
	for !allUp(c.pool) {
		if time.Now().After(deadline) {
			t.Fatal("connections not all up")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return c
}

func allUp(p *pool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.slots {
		if s.conn == nil || !s.conn.usable() {
			return false
		}
	}
	return true
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// linesOn returns the texts starting with prefix, with their connections.
func linesWith(s *fakeserver.Server, prefix string) []fakeserver.Line {
	var out []fakeserver.Line
	for _, l := range s.Lines() {
		if strings.HasPrefix(l.Text, prefix) {
			out = append(out, l)
		}
	}
	return out
}

func countPrefix(prefix string, n int) func([]fakeserver.Line) bool {
	return func(lines []fakeserver.Line) bool {
		c := 0
		for _, l := range lines {
			if strings.HasPrefix(l.Text, prefix) {
				c++
			}
		}
		return c >= n
	}
}

func TestFormatSeconds(t *testing.T) {
	cases := map[time.Duration]string{
		30 * time.Second:             "30",
		500 * time.Millisecond:       "0.5",
		1500 * time.Microsecond:      "0.0015",
		time.Nanosecond:              "0.000001",
		0:                            "0",
		86400 * time.Second:          "86400",
		1234567 * time.Microsecond:   "1.234567",
		1234567891 * time.Nanosecond: "1.234568",
		math.MaxInt64:                "9223372036.854776",
		1500 * time.Nanosecond:       "0.000002",
		1499 * time.Nanosecond:       "0.000001",
	}
	for d, want := range cases {
		if got := formatSeconds(d); got != want {
			t.Errorf("formatSeconds(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestValidKeyAndToken(t *testing.T) {
	for _, k := range []string{"", "a b", "a\x00", "a\u0085", strings.Repeat("x", 251), "\xff"} {
		if validKey(k) {
			t.Errorf("validKey(%q) = true", k)
		}
	}
	for _, k := range []string{"k", "orders/42", strings.Repeat("x", 250), "clé"} {
		if !validKey(k) {
			t.Errorf("validKey(%q) = false", k)
		}
	}
	if v, err := ParseToken("007"); err != nil || v != 7 {
		t.Errorf("ParseToken(007) = %v, %v", v, err)
	}
	if v, err := ParseToken("18446744073709551615"); err != nil || v != 1<<64-1 {
		t.Errorf("ParseToken(max) = %v, %v", v, err)
	}
	for _, s := range []string{"", "-1", "+1", "1e3", "18446744073709551616", "1.0"} {
		if _, err := ParseToken(s); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseToken(%q) err = %v", s, err)
		}
	}
}

func TestAcquireReleaseOnTheWire(t *testing.T) {
	s := startFake(t)
	c := dialT(t, []string{s.Addr}, WithName("billing"))
	ctx := ctxT(t)
	if !s.Wait(bound, countPrefix("I billing#", 2)) {
		t.Fatalf("want two named connections, got %v", s.Texts(""))
	}
	if len(s.Accepts()) != 2 {
		t.Fatalf("want 2 connections to a single address, got %d", len(s.Accepts()))
	}
	l, err := c.Acquire(ctx, "orders/42", AcquireOptions{Lease: 30 * time.Second, Wait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Texts("A "); len(got) != 1 || got[0] != "A orders/42 30 5" {
		t.Fatalf("A lines %q", got)
	}
	if l.TokenString() != strconv.FormatUint(l.Token(), 10) || l.Token() == 0 {
		t.Fatalf("token %v %q", l.Token(), l.TokenString())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := s.Texts("R "); len(got) != 1 || got[0] != "R orders/42 "+l.TokenString() {
		t.Fatalf("R lines %q", got)
	}
	if err := l.Release(ctx); !errors.Is(err, ErrStale) {
		t.Fatalf("second release: %v", err)
	}
	// Shares and sub-second leases on the wire.
	if _, err := c.Acquire(ctx, "r", AcquireOptions{Lease: 1500 * time.Millisecond, Wait: 250 * time.Millisecond, Share: Read}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Acquire(ctx, "sem", AcquireOptions{Lease: time.Second, Share: Semaphore(3)}); err != nil {
		t.Fatal(err)
	}
	got := s.Texts("A ")
	if got[1] != "A r 1.5 0.25 r" || got[2] != "A sem 1 0 3" {
		t.Fatalf("A lines %q", got)
	}
}

func TestRoundRobin(t *testing.T) {
	s := startFake(t)
	c := dialT(t, []string{s.Addr})
	ctx := ctxT(t)
	for i := 0; i < 4; i++ {
		if _, err := c.Acquire(ctx, "k"+strconv.Itoa(i), AcquireOptions{Lease: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	ls := linesWith(s, "A ")
	for i := 1; i < len(ls); i++ {
		if ls[i].Conn == ls[i-1].Conn {
			t.Fatalf("consecutive acquires on one connection: %+v", ls)
		}
	}
}

func TestInvalidArguments(t *testing.T) {
	s := startFake(t)
	c := dialT(t, []string{s.Addr})
	ctx := ctxT(t)
	bad := []struct {
		key string
		o   AcquireOptions
	}{
		{"a b", AcquireOptions{Lease: time.Second}},
		{"", AcquireOptions{Lease: time.Second}},
		{"k", AcquireOptions{}},
		{"k", AcquireOptions{Lease: time.Second, Wait: -1}},
		{"k", AcquireOptions{Lease: time.Second, Share: Semaphore(70000)}},
		{"k", AcquireOptions{Lease: time.Second, Share: Share(-7)}},
	}
	for _, b := range bad {
		if _, err := c.Acquire(ctx, b.key, b.o); !errors.Is(err, ErrInvalid) {
			t.Errorf("Acquire(%q, %+v) = %v, want ErrInvalid", b.key, b.o, err)
		}
	}
	if len(s.Texts("A ")) != 0 {
		t.Fatalf("invalid acquires were sent: %q", s.Texts("A "))
	}
	if _, err := Dial(ctx, []string{"nohostport"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad address: %v", err)
	}
	if _, err := Dial(ctx, []string{s.Addr}, WithName("a b")); !errors.Is(err, ErrInvalid) {
		t.Errorf("bad name: %v", err)
	}
}

func TestCancelSendsWithdraw(t *testing.T) {
	s := startFake(t)
	c := dialT(t, []string{s.Addr})
	held := s.Grant("k", "other", 60)
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() {
		_, err := c.Acquire(ctx, "k", AcquireOptions{Lease: 30 * time.Second})
		done <- err
	}()
	a, ok := s.WaitLine(bound, "A k ")
	if !ok {
		t.Fatal("no A")
	}
	if !s.Wait(bound, func([]fakeserver.Line) bool { return s.Waiting("k") == 1 }) {
		t.Fatal("not queued")
	}
	cancel()
	var err error
	select {
	case err = <-done:
	case <-time.After(bound):
		t.Fatal("acquire did not return")
	}
	if !errors.Is(err, ErrCancelled) || !errors.Is(err, context.Canceled) {
		t.Fatalf("err %v", err)
	}
	cl, ok := s.WaitLine(bound, "C k")
	if !ok || cl.Text != "C k" || cl.Conn != a.Conn {
		t.Fatalf("want C k on connection %d, got %+v (lines %q)", a.Conn, cl, s.Texts(""))
	}
	if s.Waiting("k") != 0 {
		t.Fatal("waiter left in the queue")
	}
	if h := s.Held("k"); len(h) != 1 || h[0] != held {
		t.Fatalf("held %v", h)
	}
}

func TestCrossedGrantIsReleased(t *testing.T) {
	s := startFake(t)
	c := dialT(t, []string{s.Addr})
	var mu sync.Mutex
	var aConn *fakeserver.Conn
	s.SetHook(func(cn *fakeserver.Conn, line string) bool {
		mu.Lock()
		defer mu.Unlock()
		switch line {
		case "A k 30 0":
			aConn = cn // hold the acquire
			return true
		case "C k":
			// The grant crosses the withdrawal.
			cn.Write("A k 4242")
			cn.Write("C k NONE")
			return true
		case "R k 4242":
			cn.Write("R k OK")
			return true
		}
		return false
	})
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() {
		_, err := c.Acquire(ctx, "k", AcquireOptions{Lease: 30 * time.Second})
		done <- err
	}()
	if _, ok := s.WaitLine(bound, "A k"); !ok {
		t.Fatal("no A")
	}
	cancel()
	if err := <-done; !errors.Is(err, ErrCancelled) {
		t.Fatalf("err %v", err)
	}
	if _, ok := s.WaitLine(bound, "R k 4242"); !ok {
		t.Fatalf("crossed grant not released: %q", s.Texts(""))
	}
	mu.Lock()
	defer mu.Unlock()
	if aConn == nil {
		t.Fatal("hook saw no A")
	}
}

func TestReleaseRetriedAcrossDrops(t *testing.T) {
	s := startFake(t)
	c := dialT(t, []string{s.Addr})
	ctx := ctxT(t)
	l, err := c.Acquire(ctx, "k", AcquireOptions{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var drops atomic.Int32
	s.SetHook(func(cn *fakeserver.Conn, line string) bool {
		if strings.HasPrefix(line, "R ") && drops.Add(1) <= 3 {
			cn.Close()
			return true
		}
		return false
	})
	start := time.Now()
	if err := l.Release(ctx); err != nil {
		t.Fatalf("release: %v (lines %q)", err, s.Texts(""))
	}
	if el := time.Since(start); el > ReleaseRetryFor {
		t.Fatalf("release took %v", el)
	}
	if n := len(s.Texts("R ")); n < 4 {
		t.Fatalf("want >= 4 copies, got %d", n)
	}
	if len(s.Held("k")) != 0 {
		t.Fatal("still held")
	}
}

// A release copy that gets no answer is sent again 200 ms later, on the
// other connection.
func TestReleaseRetriedEvery200ms(t *testing.T) {
	s := startFake(t)
	c := dialT(t, []string{s.Addr})
	ctx := ctxT(t)
	l, err := c.Acquire(ctx, "k", AcquireOptions{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int32
	s.SetHook(func(cn *fakeserver.Conn, line string) bool {
		return strings.HasPrefix(line, "R ") && n.Add(1) == 1 // the first copy is lost
	})
	start := time.Now()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("release took %v", el)
	}
	rs := linesWith(s, "R ")
	if len(rs) != 2 || rs[0].Conn == rs[1].Conn {
		t.Fatalf("copies %+v", rs)
	}
	if gap := rs[1].At.Sub(rs[0].At); gap < 150*time.Millisecond || gap > time.Second {
		t.Fatalf("second copy after %v, want 200 ms", gap)
	}
}

func TestReleaseGivesUpAfterFiveSeconds(t *testing.T) {
	s := startFake(t)
	c := dialT(t, []string{s.Addr})
	ctx := ctxT(t)
	l, err := c.Acquire(ctx, "k", AcquireOptions{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// Every release copy kills its connection: retried every 200 ms.
	s.SetHook(func(cn *fakeserver.Conn, line string) bool {
		if strings.HasPrefix(line, "R ") {
			cn.Close()
			return true
		}
		return false
	})
	start := time.Now()
	err = l.Release(ctx)
	el := time.Since(start)
	if !errors.Is(err, ErrNoConnection) {
		t.Fatalf("err %v", err)
	}
	if el < ReleaseRetryFor-100*time.Millisecond || el > ReleaseRetryFor+time.Second {
		t.Fatalf("gave up after %v", el)
	}
	rs := linesWith(s, "R ")
	if len(rs) < 2 {
		t.Fatalf("copies: %d", len(rs))
	}
}

func TestReleaseUnansweredBound(t *testing.T) {
	s := startFake(t)
	c := dialT(t, []string{s.Addr})
	ctx := ctxT(t)
	l, err := c.Acquire(ctx, "k", AcquireOptions{Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	s.SetStall(true)
	start := time.Now()
	err = l.Release(ctx)
	if !errors.Is(err, ErrNoConnection) {
		t.Fatalf("err %v", err)
	}
	if el := time.Since(start); el > ReleaseRetryFor+time.Second {
		t.Fatalf("took %v", el)
	}
}

func TestRedirectToActive(t *testing.T) {
	active := startFake(t)
	standby := startFake(t)
	standby.SetRedirect(active.Addr)
	c := dialT(t, []string{standby.Addr})
	ctx := ctxT(t)
	l, err := c.Acquire(ctx, "k", AcquireOptions{Lease: time.Minute, Wait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// Each of the two connections to the standby is redirected once at most.
	if got := standby.Texts("A "); len(got) > 2 {
		t.Fatalf("standby A lines %q", got)
	}
	if got := active.Texts("A "); len(got) != 1 {
		t.Fatalf("active A lines %q", got)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := active.Texts("R "); len(got) != 1 {
		t.Fatalf("active R lines %q", got)
	}
}

func TestNoActiveKnownRetriesUntilWait(t *testing.T) {
	standby := startFake(t)
	standby.SetRedirect("*")
	c := dialT(t, []string{standby.Addr})
	ctx := ctxT(t)
	start := time.Now()
	_, err := c.Acquire(ctx, "k", AcquireOptions{Lease: time.Minute, Wait: time.Second})
	el := time.Since(start)
	if !errors.Is(err, ErrNoConnection) {
		t.Fatalf("err %v", err)
	}
	if el < 800*time.Millisecond || el > 3*time.Second {
		t.Fatalf("gave up after %v", el)
	}
	if n := len(standby.Texts("A ")); n < 3 {
		t.Fatalf("retries: %d", n)
	}
}

func TestPairingByOpAndKey(t *testing.T) {
	s := startFake(t)
	c := dialT(t, []string{s.Addr})
	ctx := ctxT(t)
	var mu sync.Mutex
	held := map[string]*fakeserver.Conn{}
	// The node answers b before a, on one connection.
	s.SetHook(func(cn *fakeserver.Conn, line string) bool {
		mu.Lock()
		defer mu.Unlock()
		if strings.HasPrefix(line, "A a ") || strings.HasPrefix(line, "A b ") {
			held[line[2:3]] = cn
			if len(held) == 2 {
				held["b"].Write("A b 222")
				held["a"].Write("E A a share does not match the key")
			}
			return true
		}
		return false
	})
	// Both on one connection: a single-connection pool.
	s.StopListening()
	p := c.pool
	p.mu.Lock()
	second := p.slots[1].conn
	p.mu.Unlock()
	second.close()
	type res struct {
		l   *Lock
		err error
	}
	ra, rb := make(chan res, 1), make(chan res, 1)
	go func() { l, err := c.Acquire(ctx, "a", AcquireOptions{Lease: time.Minute}); ra <- res{l, err} }()
	go func() { l, err := c.Acquire(ctx, "b", AcquireOptions{Lease: time.Minute}); rb <- res{l, err} }()
	a, b := <-ra, <-rb
	if b.err != nil || b.l.Token() != 222 {
		t.Fatalf("b: %+v", b)
	}
	if !errors.Is(a.err, ErrRejected) || !strings.Contains(a.err.Error(), "share does not match") {
		t.Fatalf("a: %+v", a)
	}
}

func TestOneOutstandingAcquirePerKeyPerConnection(t *testing.T) {
	s := startFake(t)
	c := dialT(t, []string{s.Addr})
	ctx := ctxT(t)
	tok := s.Grant("k", "other", 60)
	errs := make(chan error, 3)
	for i := 0; i < 3; i++ {
		go func() {
			l, err := c.Acquire(ctx, "k", AcquireOptions{Lease: time.Minute})
			if err == nil {
				err = l.Release(ctx)
			}
			errs <- err
		}()
	}
	if !s.Wait(bound, countPrefix("A k", 2)) {
		t.Fatal("two acquires not sent")
	}
	// The third waits its turn.
	time.Sleep(300 * time.Millisecond)
	as := linesWith(s, "A k")
	if len(as) != 2 || as[0].Conn == as[1].Conn {
		t.Fatalf("want one A per connection, got %+v", as)
	}
	s.Expire("k", tok)
	for i := 0; i < 3; i++ {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(bound):
			t.Fatal("acquires did not finish")
		}
	}
	// At no time two unanswered A k on one connection: the third A was
	// sent after the first grant on its connection.
	as = linesWith(s, "A k")
	if len(as) != 3 {
		t.Fatalf("A lines %+v", as)
	}
}

// An acquire waiting for its turn in the client (both connections carry
// an acquire of the key) ends with ErrTimeout when its wait runs out.
func TestTurnWaitTimesOut(t *testing.T) {
	s := startFake(t)
	c := dialT(t, []string{s.Addr})
	ctx := ctxT(t)
	s.Grant("k", "other", 60)
	for i := 0; i < 2; i++ {
		go c.Acquire(ctx, "k", AcquireOptions{Lease: time.Minute, Wait: 5 * time.Second})
	}
	if !s.Wait(bound, countPrefix("A k", 2)) {
		t.Fatal("two acquires not sent")
	}
	start := time.Now()
	_, err := c.Acquire(ctx, "k", AcquireOptions{Lease: time.Minute, Wait: 300 * time.Millisecond})
	if !errors.Is(err, ErrTimeout) {
		t.Fatalf("err %v", err)
	}
	if el := time.Since(start); el > 1500*time.Millisecond {
		t.Fatalf("took %v", el)
	}
	if n := len(s.Texts("A k")); n != 2 {
		t.Fatalf("%d A lines", n)
	}
}

func TestOneOutstandingObservePerKeyPerConnection(t *testing.T) {
	s := startFake(t)
	c := dialT(t, []string{s.Addr})
	ctx := ctxT(t)
	errs := make(chan error, 3)
	for i := 0; i < 3; i++ {
		go func() {
			_, err := c.WaitChange(ctx, "k", 0, 0)
			errs <- err
		}()
	}
	if !s.Wait(bound, countPrefix("O k", 2)) {
		t.Fatal("two observes not sent")
	}
	time.Sleep(300 * time.Millisecond)
	os := linesWith(s, "O k")
	if len(os) != 2 || os[0].Conn == os[1].Conn {
		t.Fatalf("want one O per connection, got %+v", os)
	}
	s.Grant("k", "x#1", 60)
	for i := 0; i < 3; i++ {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(bound):
			t.Fatal("observes did not finish")
		}
	}
}

func TestDropDuringAcquireMovesOn(t *testing.T) {
	s := startFake(t)
	c := dialT(t, []string{s.Addr})
	ctx := ctxT(t)
	var n atomic.Int32
	s.SetHook(func(cn *fakeserver.Conn, line string) bool {
		if strings.HasPrefix(line, "A ") && n.Add(1) == 1 {
			cn.Close()
			return true
		}
		return false
	})
	if _, err := c.Acquire(ctx, "k", AcquireOptions{Lease: time.Minute, Wait: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	as := linesWith(s, "A ")
	if len(as) != 2 || as[0].Conn == as[1].Conn {
		t.Fatalf("A lines %+v", as)
	}
	// Every connection drops: no_connection after as many tries as
	// connections.
	s.SetHook(func(cn *fakeserver.Conn, line string) bool {
		if strings.HasPrefix(line, "A ") {
			cn.Close()
			return true
		}
		return false
	})
	s.Wait(bound, func([]fakeserver.Line) bool { return c.pool.up() && len(s.Conns()) == 2 })
	if _, err := c.Acquire(ctx, "k2", AcquireOptions{Lease: time.Minute, Wait: 5 * time.Second}); !errors.Is(err, ErrNoConnection) {
		t.Fatalf("err %v", err)
	}
}

func TestReconnectEveryThreeSeconds(t *testing.T) {
	s := startFake(t)
	var mu sync.Mutex
	var dials []time.Time
	d := &net.Dialer{}
	dialer := func(ctx context.Context, network, addr string) (net.Conn, error) {
		mu.Lock()
		dials = append(dials, time.Now())
		mu.Unlock()
		return d.DialContext(ctx, network, addr)
	}
	c := dialT(t, []string{s.Addr}, WithDialer(dialer))
	ctx := ctxT(t)
	s.StopListening()
	s.DropAll()
	down := time.Now()
	time.Sleep(6500 * time.Millisecond)
	mu.Lock()
	var after []time.Time
	for _, at := range dials {
		if at.After(down) {
			after = append(after, at)
		}
	}
	mu.Unlock()
	// Two slots, each redialled every 3 s: 4 to 6 attempts in 6.5 s, no
	// two of one slot closer than 3 s: never more than 2 per 3 s window.
	if len(after) < 4 || len(after) > 6 {
		t.Fatalf("%d dial attempts in 6.5 s: %v", len(after), after)
	}
	for i := 2; i < len(after); i++ {
		if gap := after[i].Sub(after[i-2]); gap < 2900*time.Millisecond {
			t.Fatalf("attempts too close: %v", after)
		}
	}
	// Acquire while down: no_connection after trying every address once.
	start := time.Now()
	if _, err := c.Acquire(ctx, "k", AcquireOptions{Lease: time.Minute}); !errors.Is(err, ErrNoConnection) {
		t.Fatalf("err %v", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("no_connection after %v", el)
	}
	if err := s.Listen(); err != nil {
		t.Fatal(err)
	}
	if !s.Wait(4*time.Second, func([]fakeserver.Line) bool { return len(s.Conns()) == 2 }) {
		t.Fatal("not reconnected within the interval")
	}
	if _, err := c.Acquire(ctx, "k", AcquireOptions{Lease: time.Minute}); err != nil {
		t.Fatal(err)
	}
}

func TestStalledNodeBoundsAcquire(t *testing.T) {
	s := startFake(t)
	c := dialT(t, []string{s.Addr})
	ctx := ctxT(t)
	s.SetStall(true)
	start := time.Now()
	_, err := c.Acquire(ctx, "k", AcquireOptions{Lease: time.Minute, Wait: time.Second})
	el := time.Since(start)
	if !errors.Is(err, ErrTimeout) && !errors.Is(err, ErrNoConnection) {
		t.Fatalf("err %v", err)
	}
	if el > 4*time.Second {
		t.Fatalf("acquire ended after %v", el)
	}
}

func TestKeepAliveRenewsAndLost(t *testing.T) {
	s := startFake(t)
	c := dialT(t, []string{s.Addr})
	ctx := ctxT(t)
	l, err := c.Acquire(ctx, "k", AcquireOptions{Lease: 900 * time.Millisecond, KeepAlive: true})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Wait(bound, countPrefix("N k "+l.TokenString()+" 0.9", 3)) {
		t.Fatalf("renewals: %q", s.Texts("N "))
	}
	select {
	case <-l.Lost():
		t.Fatalf("lost while renewed: %v", l.Err())
	default:
	}
	// The node forgets the grant: the next renewal is STALE -> lost.
	s.Expire("k", l.Token())
	select {
	case <-l.Lost():
	case <-time.After(bound):
		t.Fatal("not lost")
	}
	if !errors.Is(l.Err(), ErrLost) {
		t.Fatalf("Err %v", l.Err())
	}
}

func TestKeepAliveLostWhenRenewalsFail(t *testing.T) {
	s := startFake(t)
	c := dialT(t, []string{s.Addr})
	ctx := ctxT(t)
	l, err := c.Acquire(ctx, "k", AcquireOptions{Lease: 900 * time.Millisecond, KeepAlive: true})
	if err != nil {
		t.Fatal(err)
	}
	s.SetHook(func(cn *fakeserver.Conn, line string) bool { return strings.HasPrefix(line, "N ") })
	start := time.Now()
	select {
	case <-l.Lost():
	case <-time.After(bound):
		t.Fatal("not lost")
	}
	if el := time.Since(start); el > 1200*time.Millisecond {
		t.Fatalf("lost after %v, lease 900ms", el)
	}
	// A released lock is never reported lost.
	s.SetHook(nil)
	l2, err := c.Acquire(ctx, "k2", AcquireOptions{Lease: 300 * time.Millisecond, KeepAlive: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l2.Lost():
		t.Fatal("lost after release")
	case <-time.After(600 * time.Millisecond):
	}
}

func TestObserve(t *testing.T) {
	s := startFake(t)
	c := dialT(t, []string{s.Addr})
	ctx, cancel := context.WithCancel(ctxT(t))
	o, err := c.Observe(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	st := <-o.C
	if st.Held() || st.Holder != "" {
		t.Fatalf("first state %+v", st)
	}
	tok := s.Grant("k", "web-1#abc", 60)
	st = <-o.C
	if st.Token != tok || st.Holder != "web-1#abc" || st.Value() != "web-1" {
		t.Fatalf("state %+v", st)
	}
	if got := s.Texts("O k"); got[0] != "O k ? 0" || got[1] != "O k 0 10" {
		t.Fatalf("O lines %q", got)
	}
	s.Expire("k", tok)
	if st = <-o.C; st.Token != 0 {
		t.Fatalf("state %+v", st)
	}
	cancel()
	for range o.C {
	}
	if !errors.Is(o.Err(), ErrCancelled) {
		t.Fatalf("Err %v", o.Err())
	}
	// WaitChange: a wait that runs out repeats the token: ErrTimeout.
	st, err = c.WaitChange(ctxT(t), "k", 0, 200*time.Millisecond)
	if !errors.Is(err, ErrTimeout) || st.Token != 0 {
		t.Fatalf("WaitChange %+v %v", st, err)
	}
}

func TestCampaignLeaderResign(t *testing.T) {
	s := startFake(t)
	c := dialT(t, []string{s.Addr}, WithName("node"))
	ctx := ctxT(t)
	ld, err := c.Leader(ctx, "e")
	if err != nil || ld.Token != 0 || ld.Value != "" {
		t.Fatalf("Leader %+v %v", ld, err)
	}
	lead, err := c.Campaign(ctx, "e", "10.0.0.1:80", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.WaitLine(bound, "I 10.0.0.1:80#"+c.instance); !ok {
		t.Fatalf("no connection named by the value: %q", s.Texts("I "))
	}
	ld, err = c.Leader(ctx, "e")
	if err != nil || ld.Value != "10.0.0.1:80" || ld.Token != lead.Token() {
		t.Fatalf("Leader %+v %v", ld, err)
	}
	// A second candidate waits; cancelling it withdraws it.
	c2 := dialT(t, []string{s.Addr})
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := c2.Campaign(cctx, "e", "other", 30*time.Second); done <- err }()
	s.Wait(bound, func([]fakeserver.Line) bool { return s.Waiting("e") == 1 })
	cancel()
	if err := <-done; !errors.Is(err, ErrCancelled) {
		t.Fatalf("err %v", err)
	}
	if err := lead.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	ld, err = c.Leader(ctx, "e")
	if err != nil || ld.Token != 0 {
		t.Fatalf("Leader after resign %+v %v", ld, err)
	}
	for _, v := range []string{"", "a b", "x\x01", strings.Repeat("v", 238)} {
		if _, err := c.Campaign(ctx, "e", v, time.Second); !errors.Is(err, ErrInvalid) {
			t.Errorf("Campaign value %q: %v", v, err)
		}
	}
}

func TestTLS(t *testing.T) {
	certs, err := testcerts.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, mutual := range []bool{false, true} {
		s, err := fakeserver.Start(certs.ServerConfig(mutual))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
		c := dialT(t, []string{s.Addr}, WithTLS(certs.ClientConfig(mutual)))
		l, err := c.Acquire(ctxT(t), "k", AcquireOptions{Lease: time.Minute})
		if err != nil {
			t.Fatalf("mutual=%v: %v", mutual, err)
		}
		if err := l.Release(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		// Without the client certificate (mutual) or the CA: refused.
		bad := certs.ClientConfig(false)
		if !mutual {
			bad.RootCAs = nil
		}
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		_, err = Dial(ctx, []string{s.Addr}, WithTLS(bad))
		cancel()
		if !errors.Is(err, ErrNoConnection) {
			t.Fatalf("mutual=%v: bad TLS config dialled: %v", mutual, err)
		}
	}
	// The host in the address is verified: the certificate has no SAN for
	// 127.0.0.2.
	s, err := fakeserver.Start(certs.ServerConfig(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	_, port, _ := net.SplitHostPort(s.Addr)
	cfg := certs.ClientConfig(false)
	cfg.ServerName = ""
	d := &net.Dialer{}
	redirect := func(ctx context.Context, network, addr string) (net.Conn, error) {
		return d.DialContext(ctx, network, "127.0.0.1:"+port)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	if _, err := Dial(ctx, []string{"127.0.0.2:" + port}, WithTLS(cfg), WithDialer(redirect)); !errors.Is(err, ErrNoConnection) {
		t.Fatalf("wrong host accepted: %v", err)
	}
}

// A renewal that gets no answer ends by the time the lease it meant to
// extend runs out.
func TestRenewUnansweredBound(t *testing.T) {
	s := startFake(t)
	c := dialT(t, []string{s.Addr})
	ctx := ctxT(t)
	start := time.Now()
	l, err := c.Acquire(ctx, "k", AcquireOptions{Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s.SetStall(true)
	err = l.Renew(ctx, 10*time.Second)
	if !errors.Is(err, ErrNoConnection) {
		t.Fatalf("err %v", err)
	}
	if el := time.Since(start); el > 1300*time.Millisecond {
		t.Fatalf("renewal ended %v after the acquire, lease 1 s", el)
	}
	select {
	case <-l.Lost():
	case <-time.After(bound):
		t.Fatal("not lost")
	}
	if n := len(s.Texts("N k ")); n != 2 {
		t.Fatalf("%d renewal copies, want one per connection", n)
	}
}
