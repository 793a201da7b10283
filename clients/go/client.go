package lockservice

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"net"
	"strconv"
	"sync"
	"time"
)

// Version is this client's version.
const Version = "0.2.0"

const (
	// ReleaseRetryFor is how long a release is retried before it fails
	// with ErrNoConnection.
	ReleaseRetryFor = 5 * time.Second
	// ReleaseRetryEvery is the interval between two copies of a release
	// (or a renewal) that has not been answered.
	ReleaseRetryEvery = 200 * time.Millisecond
	// acquireGrace: an acquire with a wait ends at most this long after
	// its wait ran out, even if the node never answers.
	acquireGrace = 2 * time.Second
	// noActiveFor: how long "M ... *" (no active known) is retried when the
	// acquire has no wait.
	noActiveFor = 10 * time.Second
	// noActiveEvery: the interval of those retries.
	noActiveEvery = 100 * time.Millisecond
	// noConnectionFor bounds how long an acquire waits for a connection.
	noConnectionFor = 10 * time.Second
	// maxRedirects bounds the redirects one attempt of a request follows in
	// a row; beyond them it is treated like "M ... *" (no active known).
	maxRedirects = 20
	// sameMoment: connections to one address that drop within this long
	// of each other went down together (the node died), and cost a request
	// one try, not one each.
	sameMoment = time.Second
	// withdrawFor bounds how long a cancelled acquire waits for the node to
	// confirm its withdrawal (and for the release of a grant that crossed).
	withdrawFor = 2 * time.Second
)

// Option configures Dial.
type Option func(*options)

type options struct {
	name       string
	tls        *tls.Config
	dial       func(ctx context.Context, network, addr string) (net.Conn, error)
	background bool
}

// WithName names this client's connections: the server shows its holds and
// waits by this name (the client adds "#<instance id>"). It follows the key
// grammar and is at most 237 bytes.
func WithName(name string) Option { return func(o *options) { o.name = name } }

// WithTLS connects with TLS. The server's certificate is verified against
// cfg.RootCAs and against the host of each address (an IP address matches
// an IP SAN) unless cfg.ServerName is set; set cfg.Certificates to present
// a client certificate (mutual TLS).
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

// WithDialer replaces the function used to open TCP connections.
func WithDialer(dial func(ctx context.Context, network, addr string) (net.Conn, error)) Option {
	return func(o *options) { o.dial = dial }
}

// WithBackgroundConnect makes Dial return at once: connections come up in
// the background, and calls made before any is up wait for one (or fail with
// ErrNoConnection once every address was tried).
func WithBackgroundConnect() Option { return func(o *options) { o.background = true } }

// Client is a connection to one lockservice cluster: one persistent
// connection per address (two when given a single address), used
// round-robin, redialled every 3 s in the background, following M
// redirects to the active node. It is safe for concurrent use.
type Client struct {
	addrs    []string
	opts     options
	instance string
	pool     *pool

	mu     sync.Mutex
	closed bool
	locks  map[*Lock]struct{}
	pools  map[*pool]struct{} // campaign pools
}

// Dial starts a client for the nodes at addrs ("host:port", one per node of
// the cluster). It returns once a connection is up, or fails with
// ErrNoConnection once every address was tried, or with ErrCancelled when
// ctx ends first (see WithBackgroundConnect to return at once).
func Dial(ctx context.Context, addrs []string, opts ...Option) (*Client, error) {
	var o options
	for _, f := range opts {
		f(&o)
	}
	if len(addrs) == 0 {
		return nil, newError(ErrInvalid, "dial", "", "no address")
	}
	for _, a := range addrs {
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" || port == "" {
			return nil, newError(ErrInvalid, "dial", "", "bad address "+strconv.Quote(a)+" (want host:port)")
		}
	}
	if o.name != "" && (!validKey(o.name) || len(o.name) > MaxKey-1-instanceHex) {
		return nil, newError(ErrInvalid, "dial", "", "bad name "+strconv.Quote(o.name)+
			": 1-237 bytes of UTF-8, no spaces or control characters")
	}
	if o.dial == nil {
		d := &net.Dialer{}
		o.dial = d.DialContext
	}
	c := &Client{addrs: append([]string(nil), addrs...), opts: o, instance: newInstance(),
		locks: map[*Lock]struct{}{}, pools: map[*pool]struct{}{}}
	c.pool = newPool(c.addrs, o.name+"#"+c.instance, o.tls, o.dial)
	if o.background {
		return c, nil
	}
	start := time.Now()
	for {
		ch := c.pool.watch()
		if c.pool.up() {
			return c, nil
		}
		if c.pool.tryAll(start) {
			c.Close()
			return nil, newError(ErrNoConnection, "dial", "", c.pool.lastError())
		}
		select {
		case <-ch:
		case <-ctx.Done():
			c.Close()
			return nil, cancelled("dial", "", ctx.Err())
		}
	}
}

func newInstance() string {
	b := make([]byte, instanceHex/2)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Name is the name this client's connections carry ("<name>#<instance id>").
func (c *Client) Name() string { return c.opts.name + "#" + c.instance }

// Close stops every keep-alive and closes every connection. It does not
// release held locks (their leases reclaim them): release them first.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	locks := c.locks
	c.locks = map[*Lock]struct{}{}
	pools := c.pools
	c.pools = map[*pool]struct{}{}
	c.mu.Unlock()
	for l := range locks {
		l.stopTimers()
	}
	for p := range pools {
		p.close()
	}
	c.pool.close()
	return nil
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// AcquireOptions are the parameters of an acquire.
type AcquireOptions struct {
	// Lease is how long the grant lasts unless renewed or released
	// (required, > 0; sent to the microsecond).
	Lease time.Duration
	// Wait bounds the time spent in the key's queue; 0 waits without limit
	// (the caller's context still bounds it).
	Wait time.Duration
	// Share is Exclusive (the zero value), Read or Semaphore(n).
	Share Share
	// KeepAlive renews the lock every third of its lease until it is
	// released; Lock.Lost tells when it can no longer be trusted.
	KeepAlive bool
	// LeaseSeconds and WaitSeconds, when not zero, replace Lease and Wait:
	// seconds as the wire writes them, for values a Duration cannot hold
	// (beyond about 292 years) that should still reach the node as given
	// (see Seconds).
	LeaseSeconds Seconds
	WaitSeconds  Seconds
}

// seconds is the lease and the wait of o as the wire writes them.
func (o AcquireOptions) seconds() (lease, wait Seconds) {
	lease, wait = o.LeaseSeconds, o.WaitSeconds
	if lease.IsZero() {
		lease = SecondsOf(o.Lease)
	}
	if wait.IsZero() {
		wait = SecondsOf(o.Wait)
	}
	return lease, wait
}

func checkAcquire(op, key string, o AcquireOptions) (string, error) {
	if !validKey(key) {
		return "", newError(ErrInvalid, op, "", "bad key "+strconv.Quote(key)+
			": 1-250 bytes of UTF-8, no spaces or control characters")
	}
	if o.Lease <= 0 && o.LeaseSeconds.IsZero() {
		return "", newError(ErrInvalid, op, key, "lease must be > 0")
	}
	if o.Wait < 0 && o.WaitSeconds.IsZero() {
		return "", newError(ErrInvalid, op, key, "wait must be >= 0")
	}
	share, ok := o.Share.field()
	if !ok {
		return "", newError(ErrInvalid, op, key, "bad share: Exclusive, Read or Semaphore(2..65535)")
	}
	return share, nil
}

// Acquire takes key. It returns the granted *Lock, or an error: ErrTimeout
// (not granted within o.Wait), ErrRejected (an E answer: a share that does
// not match the key's kind, a limit), ErrNoConnection, ErrInvalid, or
// ErrCancelled when ctx ends first. Cancelling ctx withdraws the request
// from the server's queue at once ("C key"); a grant that crossed the
// withdrawal is released, so no lock leaks.
func (c *Client) Acquire(ctx context.Context, key string, o AcquireOptions) (*Lock, error) {
	share, err := checkAcquire("acquire", key, o)
	if err != nil {
		return nil, err
	}
	return c.acquire(ctx, c.pool, "acquire", key, share, o)
}

func (c *Client) acquire(ctx context.Context, p *pool, op, key, share string, o AcquireOptions) (*Lock, error) {
	if c.isClosed() {
		return nil, newError(ErrNoConnection, op, key, "client closed")
	}
	if err := ctx.Err(); err != nil {
		return nil, cancelled(op, key, err)
	}
	leaseS, waitS := o.seconds()
	o.Lease, o.Wait = leaseS.Duration(), waitS.Duration()
	start := time.Now()
	var deadline time.Time
	var hard <-chan time.Time
	if o.Wait > 0 {
		deadline = start.Add(o.Wait)
		t := time.NewTimer(addSat(o.Wait, acquireGrace))
		defer t.Stop()
		hard = t.C
	}
	at := newAttempt(p, o.Wait, deadline)
	sends := 0
	queued := false
	var noConnSince time.Time
	for {
		if err := ctx.Err(); err != nil {
			return nil, cancelled(op, key, err)
		}
		if p.isClosed() {
			return nil, newError(ErrNoConnection, op, key, "client closed")
		}
		now := time.Now()
		if at.noActiveOver(now) {
			return nil, newError(ErrNoConnection, op, key, "no active node (the cluster answers M *)")
		}
		if (sends > 0 || queued) && o.Wait > 0 && !now.Before(deadline) {
			return nil, newError(ErrTimeout, op, key, "not granted within "+o.Wait.String())
		}
		changed := p.watch()
		cn, anyUp := p.pickReserved('A', key)
		if cn == nil {
			// Every connection up already carries an acquire of this key:
			// wait for a turn, in the client's own queue.
			queued = anyUp
			if !anyUp {
				if noConnSince.IsZero() {
					noConnSince = now
				}
				if p.tryAll(noConnSince) || now.Sub(noConnSince) >= noConnectionFor {
					return nil, newError(ErrNoConnection, op, key, p.lastError())
				}
			} else {
				noConnSince = time.Time{}
			}
			step := 100 * time.Millisecond
			if left := time.Until(deadline); o.Wait > 0 && queued && left < step {
				step = left
			}
			poll := time.NewTimer(step)
			select {
			case <-changed:
			case <-poll.C:
			case <-ctx.Done():
			case <-hard:
				poll.Stop()
				if sends == 0 && !queued {
					return nil, newError(ErrNoConnection, op, key, "no connection within the wait: "+p.lastError())
				}
				return nil, newError(ErrTimeout, op, key, "not granted within "+o.Wait.String())
			}
			poll.Stop()
			continue
		}
		noConnSince = time.Time{}
		// The first send asks for the wait given, exactly; one sent again
		// (after a drop or a redirect) asks for what is left of it.
		wf := "0"
		if o.Wait > 0 {
			if sends == 0 {
				wf = waitS.String()
			} else {
				left := time.Until(deadline)
				if left < time.Millisecond {
					left = time.Millisecond
				}
				wf = formatSeconds(left)
			}
		}
		cl, err := cn.send('A', key, "A "+key+" "+leaseS.String()+" "+wf+share, nil)
		if err != nil {
			cn.unreserve('A', key)
			continue
		}
		sends++
		var r reply
		select {
		case r = <-cl.ch:
		case <-ctx.Done():
			return nil, c.withdraw(p, cl, op, key, true, cancelled(op, key, ctx.Err()))
		case <-hard:
			return nil, c.withdraw(p, cl, op, key, false,
				newError(ErrTimeout, op, key, "no answer within the wait (+"+acquireGrace.String()+")"))
		}
		cn.unreserve('A', key)
		if r.err != nil {
			if at.dropped(cn) {
				return nil, newError(ErrNoConnection, op, key, "connection dropped "+strconv.Itoa(at.tries)+" times")
			}
			continue
		}
		f := r.fields
		if f[0] == "M" {
			if at.redirect(cn, f) {
				// No active node known right now: again shortly.
				if err := sleepCtx(ctx, noActiveEvery); err != nil {
					return nil, cancelled(op, key, err)
				}
			}
			continue
		}
		at.answered()
		switch f[0] {
		case "A":
			token, err := ParseToken(f[2])
			if len(f) != 3 || err != nil {
				return nil, newError(ErrRejected, op, key, "bad answer "+joinFields(f))
			}
			l := c.newLock(p, key, token, o)
			if ctx.Err() != nil {
				// The caller gave up as the grant arrived: give it back.
				go l.Release(context.Background())
				return nil, cancelled(op, key, ctx.Err())
			}
			c.hold(l, cl.sent, o.KeepAlive)
			return l, nil
		case "T":
			return nil, newError(ErrTimeout, op, key, "not granted within "+o.Wait.String())
		case "E":
			return nil, newError(ErrRejected, op, key, message(f))
		default:
			return nil, newError(ErrRejected, op, key, "unexpected answer "+joinFields(f))
		}
	}
}

// attempt is one request's way to its answer (an acquire, an observe)
// across dropped connections, redirects and failovers.
type attempt struct {
	p        *pool
	wait     time.Duration // 0: no limit
	deadline time.Time     // when wait > 0
	// tries counts the drops of a connection the request was outstanding
	// on; the request fails once there were as many as connections.
	tries int
	// droppedAt: when a counted drop of each address happened. Connections
	// to one address that drop together (the node died) are one try.
	droppedAt map[string]time.Time
	// redirects followed in a row since the last drop or "M *".
	redirects int
	// noActiveSince: since when the cluster says it has no active node
	// ("M ... *", or a redirect to a node that cannot be reached); zero
	// when it has answered otherwise since.
	noActiveSince time.Time
}

func newAttempt(p *pool, wait time.Duration, deadline time.Time) *attempt {
	return &attempt{p: p, wait: wait, deadline: deadline, droppedAt: map[string]time.Time{}}
}

// dropped counts the drop of cn, which carried the request; true when the
// request is out of tries. A connection the client retired itself (to
// follow a redirect), or one that went down with another connection to
// the same node that already cost a try, costs none.
func (a *attempt) dropped(cn *conn) bool {
	now := time.Now()
	a.redirects = 0
	a.noActiveSince = time.Time{}
	if cn.wasRetired() {
		return false
	}
	if t, ok := a.droppedAt[cn.addr]; ok && cn.opened.Before(t) && now.Sub(t) < sameMoment {
		return false
	}
	a.droppedAt[cn.addr] = now
	a.tries++
	return a.tries >= len(a.p.slots)
}

// stalled counts a connection that left the request unanswered beyond its
// bound as a try; true when the request is out of tries.
func (a *attempt) stalled() bool {
	a.redirects = 0
	a.tries++
	return a.tries >= len(a.p.slots)
}

// redirect follows the M answer f received on cn; true when no active node
// is known right now (M *, a redirect to a node that just refused a
// connection, or too many redirects in a row): the request is then sent
// again shortly, until its wait (10 s when it has none) runs out.
func (a *attempt) redirect(cn *conn, f []string) (noActive bool) {
	target := "*"
	if len(f) >= 4 {
		target = f[3]
	}
	if target != "*" {
		a.redirects++
		if a.redirects <= maxRedirects && a.p.switchTo(cn, target) {
			return false
		}
	}
	a.redirects = 0
	if a.noActiveSince.IsZero() {
		a.noActiveSince = time.Now()
	}
	return true
}

// answered: a node answered the request (not with M).
func (a *attempt) answered() { a.noActiveSince = time.Time{} }

// noActiveOver reports whether the cluster has said it has no active node
// for as long as the request may wait for one.
func (a *attempt) noActiveOver(now time.Time) bool {
	if a.noActiveSince.IsZero() {
		return false
	}
	if a.wait > 0 {
		return !now.Before(a.deadline)
	}
	return now.Sub(a.noActiveSince) >= noActiveFor
}

// withdraw sends "C key" for the unanswered acquire cl and settles it: a
// grant that crossed the withdrawal is released. With wait, it waits (a
// little) for the node's answers before returning err.
func (c *Client) withdraw(p *pool, cl *call, op, key string, wait bool, err error) error {
	cn := cl.conn
	cn.send('C', key, "C "+key, nil)
	settle := func(r reply) <-chan struct{} {
		cn.unreserve('A', key)
		done := make(chan struct{})
		if r.err == nil && len(r.fields) == 3 && r.fields[0] == "A" {
			if token, e := ParseToken(r.fields[2]); e == nil {
				go func() {
					defer close(done)
					c.releaseToken(context.Background(), p, key, token, "release")
				}()
				return done
			}
		}
		close(done)
		return done
	}
	if !wait {
		go func() { settle(<-cl.ch) }()
		return err
	}
	t := time.NewTimer(withdrawFor)
	defer t.Stop()
	select {
	case r := <-cl.ch:
		select {
		case <-settle(r):
		case <-t.C:
		}
	case <-t.C:
		go func() { settle(<-cl.ch) }()
	}
	return err
}

func message(f []string) string {
	if len(f) > 3 {
		return joinFields(f[3:])
	}
	return joinFields(f)
}

func joinFields(f []string) string {
	n := 0
	for _, s := range f {
		n += len(s) + 1
	}
	b := make([]byte, 0, n)
	for i, s := range f {
		if i > 0 {
			b = append(b, ' ')
		}
		b = append(b, s...)
	}
	return string(b)
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// retried sends an idempotent request (R, N) at once, then every
// ReleaseRetryEvery on a connection not already carrying a copy, until an
// answer settles it or giveUp passes. OK settles at once; STALE once no
// other copy is on its way (a retry can overtake the copy that did the
// work). It returns the answer and when the answered copy was sent.
func (c *Client) retried(ctx context.Context, p *pool, opName string, op byte, key, line string,
	giveUp time.Time, wanted func() bool) ([]string, time.Time, error) {
	if p.isClosed() {
		return nil, time.Time{}, newError(ErrNoConnection, opName, key, "client closed")
	}
	// Room for every reply that can be on its way at once (a copy per
	// connection, plus drops), so that no reader ever blocks on it.
	ch := make(chan reply, 4*len(p.slots)+8)
	carrying := map[*conn]bool{}
	var stale *reply
	problem := "no connection up"
	end := time.NewTimer(time.Until(giveUp))
	defer end.Stop()
	tick := time.NewTicker(ReleaseRetryEvery)
	defer tick.Stop()
	sendOne := func() bool {
		cn := p.pick(func(cn *conn) bool { return !carrying[cn] })
		if cn == nil {
			return false
		}
		if _, err := cn.send(op, key, line, ch); err != nil {
			return false
		}
		carrying[cn] = true
		return true
	}
	sendOne()
	resend := false
	for {
		var changed <-chan struct{}
		if resend && len(carrying) == 0 {
			changed = p.watch()
			if sendOne() {
				resend = false
				changed = nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, time.Time{}, cancelled(opName, key, ctx.Err())
		case <-end.C:
			if stale != nil {
				return stale.fields, stale.call.sent, nil
			}
			return nil, time.Time{}, newError(ErrNoConnection, opName, key, problem)
		case <-changed:
		case <-tick.C:
			if wanted != nil && !wanted() {
				return nil, time.Time{}, newError(ErrCancelled, opName, key, "no longer wanted")
			}
			sendOne()
		case r := <-ch:
			delete(carrying, r.call.conn)
			if r.err != nil {
				problem = "connection dropped"
				resend = true
				if stale != nil && len(carrying) == 0 {
					return stale.fields, stale.call.sent, nil
				}
				continue
			}
			f := r.fields
			switch {
			case f[0] == "M":
				target := "*"
				if len(f) >= 4 {
					target = f[3]
				}
				if target == "*" || !p.switchTo(r.call.conn, target) {
					// No active known right now: the next copy goes at
					// the next tick.
					problem = "no active node (M *)"
				} else {
					problem = "redirected to " + target
					resend = true
				}
				if stale != nil && len(carrying) == 0 {
					return stale.fields, stale.call.sent, nil
				}
			case f[0] == "E":
				return nil, time.Time{}, newError(ErrRejected, opName, key, message(f))
			case len(f) >= 3 && f[2] == "STALE":
				rr := r
				stale = &rr
				if len(carrying) == 0 {
					return f, r.call.sent, nil
				}
			default:
				return f, r.call.sent, nil
			}
		}
	}
}

// ReleaseToken releases the grant token of key (a token from elsewhere;
// see Lock.Release for the behaviour). It returns nil (released), an error
// of kind ErrStale (the token no longer held the key), ErrNoConnection
// (unconfirmed after 5 s of retries), ErrRejected, ErrInvalid or
// ErrCancelled.
func (c *Client) ReleaseToken(ctx context.Context, key string, token uint64) error {
	if !validKey(key) {
		return newError(ErrInvalid, "release", "", "bad key "+strconv.Quote(key))
	}
	if c.isClosed() {
		return newError(ErrNoConnection, "release", key, "client closed")
	}
	return c.releaseToken(ctx, c.pool, key, token, "release")
}

func (c *Client) releaseToken(ctx context.Context, p *pool, key string, token uint64, op string) error {
	line := "R " + key + " " + strconv.FormatUint(token, 10)
	f, _, err := c.retried(ctx, p, op, 'R', key, line, time.Now().Add(ReleaseRetryFor), nil)
	if err != nil {
		return err
	}
	if len(f) >= 3 && f[2] == "OK" {
		return nil
	}
	return newError(ErrStale, op, key, "token "+strconv.FormatUint(token, 10)+" does not hold the key")
}

// RenewToken renews the grant token of key for lease from now (a token from
// elsewhere; see Lock.Renew). Unanswered renewals are retried every 200 ms
// for 5 s at most.
func (c *Client) RenewToken(ctx context.Context, key string, token uint64, lease time.Duration) error {
	if lease <= 0 {
		return newError(ErrInvalid, "renew", key, "lease must be > 0")
	}
	return c.RenewTokenSeconds(ctx, key, token, SecondsOf(lease))
}

// RenewTokenSeconds is RenewToken with the lease as Seconds (see Seconds).
func (c *Client) RenewTokenSeconds(ctx context.Context, key string, token uint64, lease Seconds) error {
	if !validKey(key) {
		return newError(ErrInvalid, "renew", "", "bad key "+strconv.Quote(key))
	}
	if lease.IsZero() {
		return newError(ErrInvalid, "renew", key, "lease must be > 0")
	}
	if c.isClosed() {
		return newError(ErrNoConnection, "renew", key, "client closed")
	}
	line := "N " + key + " " + strconv.FormatUint(token, 10) + " " + lease.String()
	giveUp := time.Now().Add(ReleaseRetryFor)
	if lease.Duration() < ReleaseRetryFor {
		giveUp = time.Now().Add(lease.Duration())
	}
	f, _, err := c.retried(ctx, c.pool, "renew", 'N', key, line, giveUp, nil)
	if err != nil {
		return err
	}
	if len(f) >= 3 && f[2] == "OK" {
		return nil
	}
	return newError(ErrStale, "renew", key, "token "+strconv.FormatUint(token, 10)+" does not hold the key")
}

// Ping sends "P word" on the next connection and waits for its echo.
func (c *Client) Ping(ctx context.Context) error {
	cn := c.pool.pick(nil)
	if cn == nil {
		return newError(ErrNoConnection, "ping", "", c.pool.lastError())
	}
	cl, err := cn.send('P', "ping", "P ping", nil)
	if err != nil {
		return newError(ErrNoConnection, "ping", "", err.Error())
	}
	select {
	case r := <-cl.ch:
		if r.err != nil {
			return newError(ErrNoConnection, "ping", "", r.err.Error())
		}
		return nil
	case <-ctx.Done():
		return cancelled("ping", "", ctx.Err())
	}
}
