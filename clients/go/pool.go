package lockservice

import (
	"context"
	"crypto/tls"
	"net"
	"sync"
	"time"
)

// ReconnectInterval is how often a connection that is down is redialled.
const ReconnectInterval = 3 * time.Second

// readyTimeout bounds a dial and its first answer.
const readyTimeout = 5 * time.Second

// unreachableFor: a redirect to an address that failed a connection attempt
// this recently is not followed (the node it names is down: a failover is
// under way, and the cluster will name its successor shortly).
const unreachableFor = time.Second

// slot is one persistent connection of a pool, redialled in the background.
type slot struct {
	pool *pool
	home string

	// guarded by pool.mu
	addr        string // current address (a redirect may change it)
	conn        *conn
	connecting  bool
	attemptedAt time.Time // start of the last dial attempt
	failedAt    time.Time // end of the last failed attempt
	lastErr     error
	quickAt     time.Time // last immediate redial after a drop
	kick        chan struct{}
	switched    chan struct{}
}

// pool is the connections to the nodes of one cluster.
type pool struct {
	name string // sent as "I <name>"
	tls  *tls.Config
	dial func(ctx context.Context, network, addr string) (net.Conn, error)

	mu      sync.Mutex
	slots   []*slot
	next    int
	closed  bool
	changed chan struct{} // closed and replaced on any change
	watched bool          // someone holds changed: close it at the next change
	done    chan struct{}
	// failedAt: when a connection attempt to each address last failed
	// (removed once one succeeds).
	failedAt map[string]time.Time
}

func newPool(homes []string, name string, tlsConf *tls.Config,
	dial func(ctx context.Context, network, addr string) (net.Conn, error)) *pool {
	p := &pool{name: name, tls: tlsConf, dial: dial,
		changed: make(chan struct{}), done: make(chan struct{}), failedAt: map[string]time.Time{}}
	list := homes
	if len(homes) == 1 {
		list = []string{homes[0], homes[0]}
	}
	for _, h := range list {
		s := &slot{pool: p, home: h, addr: h, kick: make(chan struct{}, 1),
			switched: make(chan struct{}, 1)}
		p.slots = append(p.slots, s)
	}
	for _, s := range p.slots {
		go s.loop()
	}
	return p
}

// turn wakes whoever waits for a change (a connection up or down, a
// reservation freed).
func (p *pool) turn() {
	p.mu.Lock()
	if p.watched {
		close(p.changed)
		p.changed = make(chan struct{})
		p.watched = false
	}
	p.mu.Unlock()
}

// watch returns a channel closed at the next change.
func (p *pool) watch() <-chan struct{} {
	p.mu.Lock()
	ch := p.changed
	p.watched = true
	p.mu.Unlock()
	return ch
}

func (p *pool) close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.done)
	var conns []*conn
	for _, s := range p.slots {
		if s.conn != nil {
			conns = append(conns, s.conn)
			s.conn = nil
		}
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.close()
	}
	p.turn()
}

func (p *pool) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// pick returns the next usable connection round-robin, skipping those for
// which ok is false; nil when none.
func (p *pool) pick(ok func(*conn) bool) *conn {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.slots)
	for i := 0; i < n; i++ {
		s := p.slots[(p.next+i)%n]
		if s.conn != nil && s.conn.usable() && (ok == nil || ok(s.conn)) {
			p.next = (p.next + i + 1) % n
			return s.conn
		}
	}
	return nil
}

// pickReserved picks the next connection on which key has no outstanding
// op ('A' or 'O') and reserves it there. anyUp tells whether some
// connection is up at all (busy ones included).
func (p *pool) pickReserved(op byte, key string) (c *conn, anyUp bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.slots)
	for i := 0; i < n; i++ {
		s := p.slots[(p.next+i)%n]
		if s.conn == nil || !s.conn.usable() {
			continue
		}
		anyUp = true
		if s.conn.reserve(op, key) {
			p.next = (p.next + i + 1) % n
			return s.conn, true
		}
	}
	return nil, anyUp
}

func (p *pool) up() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.slots {
		if s.conn != nil && s.conn.usable() {
			return true
		}
	}
	return false
}

// lastError describes the last failed connection attempt.
func (p *pool) lastError() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.slots) - 1; i >= 0; i-- {
		if p.slots[i].lastErr != nil {
			return p.slots[i].lastErr.Error()
		}
	}
	return "not connected"
}

// tryAll asks every slot that is down to dial now, and reports whether each
// has made an attempt that started at or after since and failed (true: no
// address could be reached).
func (p *pool) tryAll(since time.Time) (allFailed bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	allFailed = true
	for _, s := range p.slots {
		if s.conn != nil && s.conn.usable() {
			return false
		}
		if !s.failedAt.IsZero() && !s.attemptedAt.Before(since.Add(-100*time.Millisecond)) && !s.connecting {
			continue
		}
		allFailed = false
		if !s.connecting && !s.attemptedAt.After(since) {
			select {
			case s.kick <- struct{}{}:
			default:
			}
		}
	}
	return allFailed
}

// switchTo follows a redirect: the slot of c reconnects to addr (the old
// connection is retired, not cut). It returns false, and changes nothing,
// when addr failed a connection attempt within unreachableFor: the caller
// then treats the redirect like "M *" (no active known right now).
func (p *pool) switchTo(c *conn, addr string) bool {
	p.mu.Lock()
	if t, ok := p.failedAt[addr]; ok && time.Since(t) < unreachableFor {
		p.mu.Unlock()
		return false
	}
	s := c.slot
	if s.conn != c {
		p.mu.Unlock()
		return true // the slot has moved on already
	}
	if s.addr == addr && c.addr == addr {
		p.mu.Unlock()
		return true
	}
	s.addr = addr
	s.conn = nil
	p.mu.Unlock()
	c.retire()
	select {
	case s.switched <- struct{}{}:
	default:
	}
	p.turn()
	return true
}

func (s *slot) loop() {
	p := s.pool
	var wait time.Duration
	for {
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-s.kick:
				t.Stop()
			case <-s.switched:
				t.Stop()
			case <-p.done:
				t.Stop()
				return
			}
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return
		}
		addr := s.addr
		s.connecting = true
		s.attemptedAt = time.Now()
		p.mu.Unlock()
		// Drain a stale kick.
		select {
		case <-s.kick:
		default:
		}
		c, err := s.connect(addr)
		p.mu.Lock()
		s.connecting = false
		if err != nil {
			s.lastErr = err
			s.failedAt = time.Now()
			p.failedAt[addr] = s.failedAt
			// A redirect target that cannot be reached: go home, at once
			// (home is another node, which names the active anew).
			away := addr != s.home
			s.addr = s.home
			closed := p.closed
			p.mu.Unlock()
			p.turn()
			if closed {
				return
			}
			wait = time.Until(s.attemptedAt.Add(ReconnectInterval))
			if away {
				wait = 0
			}
			continue
		}
		if p.closed {
			p.mu.Unlock()
			c.close()
			return
		}
		if s.addr != addr {
			// Redirected while dialling: follow.
			p.mu.Unlock()
			c.close()
			wait = 0
			continue
		}
		s.conn = c
		s.lastErr = nil
		s.failedAt = time.Time{}
		delete(p.failedAt, addr)
		p.mu.Unlock()
		p.turn()
	serving:
		for {
			select {
			case <-c.done:
				break serving
			case <-s.switched:
				p.mu.Lock()
				still := s.conn == c
				p.mu.Unlock()
				if !still {
					break serving
				}
			case <-p.done:
				return
			}
		}
		p.mu.Lock()
		if s.conn == c {
			s.conn = nil
			if c.addr != s.home {
				// A redirected connection that is lost goes home, which
				// redirects it to whoever is active by then.
				s.addr = s.home
			}
		}
		redirected := s.addr != c.addr
		p.mu.Unlock()
		p.turn()
		// Redial at once to follow a redirect, or after a drop (once per
		// interval: a node that keeps closing connections is not redialled
		// in a loop); else keep to the interval.
		switch {
		case redirected:
			wait = 0
		case time.Since(s.quickAt) >= ReconnectInterval:
			s.quickAt = time.Now()
			wait = 0
		default:
			wait = time.Until(s.attemptedAt.Add(ReconnectInterval))
		}
	}
}

func (s *slot) connect(addr string) (*conn, error) {
	p := s.pool
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	go func() {
		select {
		case <-p.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	nc, err := p.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if p.tls != nil {
		cfg := p.tls.Clone()
		if cfg.ServerName == "" {
			host, _, _ := net.SplitHostPort(addr)
			cfg.ServerName = host
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, err
		}
		nc = tc
	}
	if err := handshake(ctx, nc, p.name); err != nil {
		nc.Close()
		return nil, err
	}
	return newConn(s, nc, addr), nil
}
