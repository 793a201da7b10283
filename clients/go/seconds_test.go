package lockservice

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lockservice/lockservice/clients/go/internal/fakeserver"
)

func TestParseSeconds(t *testing.T) {
	cases := []struct {
		in   string
		text string
		d    time.Duration
	}{
		{"30", "30", 30 * time.Second},
		{"0.5", "0.5", 500 * time.Millisecond},
		{"0", "0", 0},
		{"-0", "0", 0},
		{"0.0", "0", 0},
		{"1.2345674", "1.234567", 1234567 * time.Microsecond},
		{"1.2345675", "1.234568", 1234568 * time.Microsecond},
		{"7.0000004", "7", 7 * time.Second},
		{"1e-9", "0.000001", time.Microsecond},
		{"1e-7", "0.000001", time.Microsecond},
		{"5e-7", "0.000001", time.Microsecond},
		{"1e-400", "0.000001", time.Microsecond},
		{"2e-6", "0.000002", 2 * time.Microsecond},
		{"0.9999996", "1", time.Second},
		{"86400", "86400", 86400 * time.Second},
		{"2.5E3", "2500", 2500 * time.Second},
		{"1e+2", "100", 100 * time.Second},
		{"3000000.5", "3000000.5", 3000000*time.Second + 500*time.Millisecond},
		{"1e10", "10000000000", math.MaxInt64},
		{"1e21", "1000000000000000000000", math.MaxInt64},
		{"9223372036.854775", "9223372036.854775", 9223372036854775000},
		{"9223372036.854776", "9223372036.854776", math.MaxInt64},
		{"1.5e300", "15" + strings.Repeat("0", 299), math.MaxInt64},
	}
	for _, c := range cases {
		s, err := ParseSeconds(c.in)
		if err != nil {
			t.Errorf("ParseSeconds(%q): %v", c.in, err)
			continue
		}
		if s.String() != c.text || s.Duration() != c.d {
			t.Errorf("ParseSeconds(%q) = %q, %d; want %q, %d", c.in, s.String(), s.Duration(), c.text, c.d)
		}
		if s.IsZero() != (c.text == "0") {
			t.Errorf("ParseSeconds(%q).IsZero() = %v", c.in, s.IsZero())
		}
	}
	for _, in := range []string{"", "-1", "-0.5", "+1", "1e", "1.", ".5", "1e400", "inf", "NaN", "0x10", "1_0", " 1", "1 ", "１"} {
		if s, err := ParseSeconds(in); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseSeconds(%q) = %q, %v; want ErrInvalid", in, s, err)
		}
	}
	if s := SecondsOf(1500 * time.Millisecond); s.String() != "1.5" || s.Duration() != 1500*time.Millisecond {
		t.Errorf("SecondsOf = %q %v", s, s.Duration())
	}
	if s := SecondsOf(-time.Second); !s.IsZero() || s.String() != "0" {
		t.Errorf("SecondsOf(-1s) = %q", s)
	}
}

// Seconds beyond a Duration reach the node as given, and the node's E
// answer is the result (not a timeout of a wrapped-round timer).
func TestHugeSecondsOnTheWire(t *testing.T) {
	s := startFake(t)
	s.SetHook(func(cn *fakeserver.Conn, line string) bool {
		f := strings.Split(line, " ")
		if (f[0] == "A" || f[0] == "N") && len(f) >= 4 && (len(f[2]) > 8 || len(f[3]) > 8) {
			cn.Write("E " + f[0] + " " + f[1] + " beyond the maximum")
			return true
		}
		return false
	})
	c := dialT(t, []string{s.Addr})
	ctx := ctxT(t)
	huge, err := ParseSeconds("1e21")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []AcquireOptions{
		{LeaseSeconds: huge, Wait: time.Second},
		{Lease: time.Minute, WaitSeconds: huge},
		{Lease: math.MaxInt64, Wait: math.MaxInt64},
	} {
		start := time.Now()
		_, err := c.Acquire(ctx, "k", o)
		if !errors.Is(err, ErrRejected) || time.Since(start) > time.Second {
			t.Fatalf("%+v: %v after %v", o, err, time.Since(start))
		}
	}
	want := []string{
		"A k 1000000000000000000000 1",
		"A k 60 1000000000000000000000",
		"A k 9223372036.854776 9223372036.854776",
	}
	if got := s.Texts("A k "); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("A lines %q, want %q", got, want)
	}
	l, err := c.Acquire(ctx, "k", AcquireOptions{Lease: time.Minute, Wait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.RenewSeconds(ctx, huge); !errors.Is(err, ErrRejected) {
		t.Fatalf("renew: %v", err)
	}
	if err := c.RenewTokenSeconds(ctx, "k", l.Token(), huge); !errors.Is(err, ErrRejected) {
		t.Fatalf("renew token: %v", err)
	}
	for _, n := range s.Texts("N k ") {
		if !strings.HasSuffix(n, " 1000000000000000000000") {
			t.Fatalf("N line %q", n)
		}
	}
	if _, err := c.CampaignSeconds(ctx, "e", "v", huge); !errors.Is(err, ErrRejected) {
		t.Fatalf("campaign: %v", err)
	}
	if got := s.Texts("A e "); len(got) != 1 || got[0] != "A e 1000000000000000000000 0" {
		t.Fatalf("campaign A lines %q", got)
	}
}

// An O cannot be withdrawn: a long observation goes in pieces of at most
// 10 s, each asking for what is left of the wait.
func TestObserveInPiecesOfTenSeconds(t *testing.T) {
	s := startFake(t)
	tok := s.Grant("k", "other#1", 600)
	// Every piece is answered after 300 ms as if it ran out unchanged.
	s.SetHook(func(cn *fakeserver.Conn, line string) bool {
		if strings.HasPrefix(line, "O k ") {
			time.AfterFunc(300*time.Millisecond, func() {
				cn.Write("O k " + strings.Fields(line)[2] + " other#1")
			})
			return true
		}
		return false
	})
	c := dialT(t, []string{s.Addr})
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() {
		_, err := c.WaitChange(ctx, "k", tok, 10500*time.Millisecond)
		done <- err
	}()
	if !s.Wait(bound, countPrefix("O k ", 4)) {
		t.Fatal("no fourth piece")
	}
	cancel()
	if err := <-done; !errors.Is(err, ErrCancelled) {
		t.Fatalf("err %v", err)
	}
	got := s.Texts("O k ")
	prefix := "O k " + strconv.FormatUint(tok, 10) + " "
	if got[0] != prefix+"10" {
		t.Fatalf("first piece %q", got[0])
	}
	for i, g := range got[1:4] {
		left, err := ParseSeconds(strings.TrimPrefix(g, prefix))
		if err != nil || left.Duration() > 10*time.Second || left.Duration() < 9*time.Second {
			t.Fatalf("piece %d: %q", i+2, g)
		}
	}
	if got[3] == prefix+"10" {
		t.Fatalf("the fourth piece asks for what is left: %q", got)
	}
	// A wait that runs out repeats the token and names the holder.
	st, err := c.WaitChange(ctxT(t), "k", tok, 200*time.Millisecond)
	if !errors.Is(err, ErrTimeout) || st.Token != tok || st.Holder != "other#1" {
		t.Fatalf("WaitChange: %+v %v", st, err)
	}
	if last := s.Texts("O k "); last[len(last)-1] != prefix+"0.2" {
		t.Fatalf("a short wait is asked as given: %q", last[len(last)-1])
	}
}

func uintText(t uint64) string { return strconv.FormatUint(t, 10) }

// Every connection to a node that dies drops at once: one try, not one
// each; the acquire goes on on the connections redialled.
func TestDropOfEveryConnectionToOneNodeIsOneTry(t *testing.T) {
	s := startFake(t)
	s.Grant("k", "other#1", 600)
	c := dialT(t, []string{s.Addr})
	ctx := ctxT(t)
	done := make(chan error, 1)
	var lock *Lock
	go func() {
		var err error
		lock, err = c.Acquire(ctx, "k", AcquireOptions{Lease: time.Minute})
		done <- err
	}()
	if !s.Wait(bound, func([]fakeserver.Line) bool { return s.Waiting("k") == 1 }) {
		t.Fatal("not queued")
	}
	s.DropAll()
	if !s.Wait(bound, func(lines []fakeserver.Line) bool {
		return countPrefix("A k ", 2)(lines) && s.Waiting("k") == 1
	}) {
		select {
		case err := <-done:
			t.Fatalf("the acquire ended: %v", err)
		default:
		}
		t.Fatal("not queued again")
	}
	for _, tok := range s.Held("k") {
		s.Expire("k", tok)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(bound):
		t.Fatal("not granted")
	}
	if err := lock.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// A failover: every connection followed M to the active, which dies; the
// standbys still name it for a while, then name its successor. A pending
// observe and a pending acquire (wait 0) follow to the successor, and a
// new acquire succeeds there; none fails.
func TestFailoverWithEveryConnectionOnTheDeadActive(t *testing.T) {
	n0, n1, n2 := startFake(t), startFake(t), startFake(t)
	n1.SetRedirect(n0.Addr)
	n2.SetRedirect(n0.Addr)
	tok := n0.Grant("k", "other#1", 600)
	n0.Grant("q", "other#1", 600)
	c := dialT(t, []string{n2.Addr, n1.Addr, n0.Addr})
	ctx := ctxT(t)
	for i := 0; i < 6; i++ {
		if _, err := c.Holder(ctx, "warm-up"); err != nil {
			t.Fatal(err)
		}
	}
	if !n0.Wait(bound, func([]fakeserver.Line) bool { return len(n0.Conns()) == 3 }) {
		t.Fatal("not all on the active")
	}
	type result struct {
		what string
		err  error
	}
	results := make(chan result, 2)
	go func() {
		st, err := c.WaitChange(ctx, "k", tok, 0)
		if err == nil && st.Token != 0 {
			err = errors.New("unexpected state")
		}
		results <- result{"observe", err}
	}()
	go func() {
		l, err := c.Acquire(ctx, "q", AcquireOptions{Lease: time.Minute})
		if err == nil {
			err = l.Release(ctx)
		}
		results <- result{"acquire", err}
	}()
	if !n0.Wait(bound, func([]fakeserver.Line) bool { return n0.Waiting("q") == 1 && len(n0.Texts("O k ")) == 1 }) {
		t.Fatal("not pending on the active")
	}
	n0.Close()
	time.Sleep(700 * time.Millisecond)
	select {
	case r := <-results:
		t.Fatalf("%s ended while no active was known: %v", r.what, r.err)
	default:
	}
	n1.SetRedirect("")
	n2.SetRedirect(n1.Addr)
	for i := 0; i < 2; i++ {
		select {
		case r := <-results:
			if r.err != nil {
				t.Fatalf("%s: %v", r.what, r.err)
			}
		case <-time.After(bound):
			t.Fatal("not done on the successor")
		}
	}
	if len(n1.Texts("O k ")) == 0 || len(n1.Texts("A q ")) == 0 {
		t.Fatalf("not re-sent to the successor: %q", n1.Texts(""))
	}
	l, err := c.Acquire(ctx, "after", AcquireOptions{Lease: time.Minute, Wait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
