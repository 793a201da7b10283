package lockservice

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"sync"
	"time"
)

// errDropped: the connection closed before the request was answered.
var errDropped = errors.New("connection dropped")

// stallAfter: a request that any node answers at once (R, N, C, P, I) and
// that is unanswered this long marks its connection as stalled: it is cut
// and redialled.
const stallAfter = 5 * time.Second

// retireAfter: a connection closed to follow a redirect is given this long
// to deliver the answers already on their way before it is cut.
const retireAfter = 2 * time.Second

type pairKey struct {
	op  byte
	key string
}

type reply struct {
	fields []string
	err    error
	call   *call
}

// call is one request waiting for its answer.
type call struct {
	op    byte
	key   string
	conn  *conn
	sent  time.Time
	ch    chan reply
	quick bool // answered at once by any live node
}

// conn is one connection: pipelined requests, answers paired by (op, key)
// in send order.
type conn struct {
	slot   *slot
	nc     net.Conn
	addr   string
	opened time.Time

	mu       sync.Mutex
	pending  map[pairKey][]*call
	busyA    map[string]bool
	busyO    map[string]bool
	out      []byte
	spare    []byte
	closed   bool
	retiring bool
	writing  bool // a caller is writing c.out
	done     chan struct{}
}

func newConn(s *slot, nc net.Conn, addr string) *conn {
	c := &conn{
		slot:    s,
		nc:      nc,
		addr:    addr,
		opened:  time.Now(),
		pending: make(map[pairKey][]*call),
		busyA:   make(map[string]bool),
		busyO:   make(map[string]bool),
		done:    make(chan struct{}),
	}
	go c.reader()
	go c.watchdog()
	return c
}

// usable: up and not retiring.
func (c *conn) usable() bool {
	c.mu.Lock()
	ok := !c.closed && !c.retiring
	c.mu.Unlock()
	return ok
}

// wasRetired reports whether the client retired this connection (to follow
// a redirect) before it closed.
func (c *conn) wasRetired() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.retiring
}

// reserve marks key as having an outstanding A (op 'A') or O (op 'O') on
// this connection; false when one is already outstanding.
func (c *conn) reserve(op byte, key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed || c.retiring {
		return false
	}
	m := c.busyA
	if op == 'O' {
		m = c.busyO
	}
	if m[key] {
		return false
	}
	m[key] = true
	return true
}

func (c *conn) unreserve(op byte, key string) {
	c.mu.Lock()
	m := c.busyA
	if op == 'O' {
		m = c.busyO
	}
	delete(m, key)
	c.mu.Unlock()
	c.slot.pool.turn()
}

// send queues line and returns its call; ch may be shared by several calls
// (it must then have room for all their replies).
func (c *conn) send(op byte, key, line string, ch chan reply) (*call, error) {
	if ch == nil {
		ch = make(chan reply, 1)
	}
	cl := &call{op: op, key: key, conn: c, ch: ch, sent: time.Now(),
		quick: op != 'A' && op != 'O'}
	pk := pairKey{op, key}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, errDropped
	}
	c.pending[pk] = append(c.pending[pk], cl)
	c.out = append(c.out, line...)
	c.out = append(c.out, '\n')
	if c.writing {
		c.mu.Unlock() // the caller writing now takes our line along
		return cl, nil
	}
	c.writing = true
	c.mu.Unlock()
	c.flush()
	return cl, nil
}

// flush writes what is queued; only one caller writes at a time (the others
// leave their lines to it), so lines reach the wire in the order they were
// queued, which is the order their calls were registered in.
func (c *conn) flush() {
	for {
		c.mu.Lock()
		buf := c.out
		if len(buf) == 0 || c.closed {
			c.writing = false
			c.mu.Unlock()
			return
		}
		c.out = c.spare[:0]
		c.spare = nil // never hand out the same array twice
		c.mu.Unlock()
		if _, err := c.nc.Write(buf); err != nil {
			c.mu.Lock()
			c.writing = false
			c.mu.Unlock()
			c.fail(err)
			return
		}
		if cap(buf) <= 64<<10 {
			c.mu.Lock()
			c.spare = buf[:0]
			c.mu.Unlock()
		}
	}
}

// pairOf is the (op, key) of the request an answer answers.
func pairOf(f []string) (pairKey, bool) {
	if len(f) < 2 || len(f[0]) != 1 {
		return pairKey{}, false
	}
	switch f[0][0] {
	case 'A', 'T':
		return pairKey{'A', f[1]}, true
	case 'R', 'N', 'C', 'O':
		return pairKey{f[0][0], f[1]}, true
	case 'P', 'I':
		if len(f) == 2 {
			return pairKey{f[0][0], f[1]}, true
		}
	case 'M', 'E':
		if len(f) >= 3 && len(f[1]) == 1 {
			return pairKey{f[1][0], f[2]}, true
		}
		if len(f) >= 3 && f[1] == "*" {
			return pairKey{'*', f[2]}, true
		}
	}
	return pairKey{}, false
}

func (c *conn) reader() {
	r := bufio.NewReaderSize(c.nc, 16<<10)
	for {
		line, err := r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			// Far longer than any answer: skip it.
			for err == bufio.ErrBufferFull {
				_, err = r.ReadSlice('\n')
			}
			if err == nil {
				continue
			}
		}
		if err != nil {
			c.fail(err)
			return
		}
		text := strings.TrimSuffix(strings.TrimSuffix(string(line), "\n"), "\r")
		if text == "" {
			continue
		}
		c.dispatch(strings.Split(text, " "))
	}
}

func (c *conn) dispatch(f []string) {
	pk, ok := pairOf(f)
	if !ok {
		return
	}
	c.mu.Lock()
	q := c.pending[pk]
	if len(q) == 0 && f[0] == "E" {
		// An error we cannot pair exactly: a node that does not know the
		// op (C or O, on an older node) may answer "E * key ...".
		for _, op := range []byte{'C', 'O', 'A', 'R', 'N'} {
			if (pk.op == '*' || pk.op == op) && (len(c.pending[pairKey{op, pk.key}]) > 0) {
				pk = pairKey{op, pk.key}
				q = c.pending[pk]
				break
			}
		}
	}
	if len(q) == 0 {
		c.mu.Unlock()
		return
	}
	cl := q[0]
	if len(q) == 1 {
		delete(c.pending, pk)
	} else {
		q[0] = nil
		c.pending[pk] = q[1:]
	}
	empty := len(c.pending) == 0
	retiring := c.retiring
	c.mu.Unlock()
	cl.ch <- reply{fields: f, call: cl}
	if retiring && empty {
		c.close()
	}
}

// fail closes the connection and fails every pending request.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	pending := c.pending
	c.pending = map[pairKey][]*call{}
	c.busyA = map[string]bool{}
	c.busyO = map[string]bool{}
	close(c.done)
	c.mu.Unlock()
	c.nc.Close()
	for _, q := range pending {
		for _, cl := range q {
			cl.ch <- reply{err: errDropped, call: cl}
		}
	}
	c.slot.pool.turn()
}

func (c *conn) close() { c.fail(errDropped) }

// retire closes the connection without losing an answer already decided:
// it stops taking requests, shuts down its sending side (the server then
// withdraws our queued acquires and writes what it has decided), and is cut
// after retireAfter at the latest.
func (c *conn) retire() {
	c.mu.Lock()
	if c.closed || c.retiring {
		c.mu.Unlock()
		return
	}
	c.retiring = true
	empty := len(c.pending) == 0
	c.mu.Unlock()
	if empty {
		c.close()
		return
	}
	switch nc := c.nc.(type) {
	case *net.TCPConn:
		nc.CloseWrite()
	case *tls.Conn:
		nc.CloseWrite()
	}
	time.AfterFunc(retireAfter, c.close)
}

// watchdog cuts a connection whose quick requests go unanswered.
func (c *conn) watchdog() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case now := <-t.C:
			stalled := false
			c.mu.Lock()
			for _, q := range c.pending {
				if len(q) > 0 && q[0].quick && now.Sub(q[0].sent) > stallAfter {
					stalled = true
					break
				}
			}
			c.mu.Unlock()
			if stalled {
				c.fail(errors.New("node stopped answering"))
				return
			}
		}
	}
}

// handshake sends "I name" and waits for its answer: a connection is up
// only once the node answers (a TLS node may refuse our certificate after
// the handshake; a paused node accepts but never answers).
func handshake(ctx context.Context, nc net.Conn, name string) error {
	if d, ok := ctx.Deadline(); ok {
		nc.SetDeadline(d)
		defer nc.SetDeadline(time.Time{})
	}
	if _, err := nc.Write([]byte("I " + name + "\n")); err != nil {
		return err
	}
	// Read byte by byte: nothing but this answer may be consumed here.
	var line []byte
	buf := make([]byte, 1)
	for {
		if _, err := nc.Read(buf); err != nil {
			return err
		}
		if buf[0] == '\n' {
			break
		}
		line = append(line, buf[0])
		if len(line) > 4096 {
			return errors.New("answer too long")
		}
	}
	text := strings.TrimSuffix(string(line), "\r")
	if text == "I "+name {
		return nil
	}
	return errors.New("node answered " + strings.TrimSpace(text))
}
