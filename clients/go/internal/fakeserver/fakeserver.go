// Package fakeserver is an in-process lockservice node for tests: it speaks
// the client protocol (A with shares, R, N, C, O, P, I),
// records every line it receives, and can be told to redirect, stall, drop
// connections or let a test answer lines itself.
package fakeserver

import (
	"bufio"
	"crypto/tls"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Line is one request line received.
type Line struct {
	Conn int       // the connection's number (1, 2, ...)
	Text string    // the line without its newline
	At   time.Time // when it was read
}

// Conn is one client connection of the fake server.
type Conn struct {
	ID   int
	srv  *Server
	nc   net.Conn
	wmu  sync.Mutex
	name string // the I name, "" if none
}

// Write sends line (a newline is added).
func (c *Conn) Write(line string) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.nc.Write([]byte(line + "\n"))
}

// Close closes the connection.
func (c *Conn) Close() { c.nc.Close() }

type grant struct {
	token uint64
	name  string
	read  bool
	timer *time.Timer
}

type waiter struct {
	conn  *Conn
	read  bool
	lease float64
	timer *time.Timer
}

type observer struct {
	conn  *Conn
	since string
	timer *time.Timer
}

type keyState struct {
	slots     int // 0: read-write key, n: semaphore
	holders   map[uint64]*grant
	queue     []*waiter
	observers []*observer
}

// Server is the fake node.
type Server struct {
	// Addr is "127.0.0.1:port".
	Addr string

	tlsConf *tls.Config
	mu      sync.Mutex
	ln      net.Listener
	conns   map[int]*Conn
	nextID  int
	lines   []Line
	accepts []time.Time
	keys    map[string]*keyState
	token   uint64
	changed chan struct{}
	closed  bool

	redirect string
	stall    bool
	hook     func(c *Conn, line string) bool
}

// Start starts a fake node on a free loopback port (TLS when cfg is not
// nil).
func Start(cfg *tls.Config) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{Addr: ln.Addr().String(), tlsConf: cfg, ln: ln, conns: map[int]*Conn{},
		keys: map[string]*keyState{}, token: 1796000000000000, changed: make(chan struct{})}
	go s.accept(ln)
	return s, nil
}

func (s *Server) accept(ln net.Listener) {
	for {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		if s.tlsConf != nil {
			nc = tls.Server(nc, s.tlsConf)
		}
		s.mu.Lock()
		s.nextID++
		c := &Conn{ID: s.nextID, srv: s, nc: nc}
		s.conns[c.ID] = c
		s.accepts = append(s.accepts, time.Now())
		s.bump()
		s.mu.Unlock()
		go s.serve(c)
	}
}

// bump wakes Wait; s.mu held.
func (s *Server) bump() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Close stops the server and closes every connection.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	ln := s.ln
	s.ln = nil
	conns := s.conns
	s.conns = map[int]*Conn{}
	s.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	for _, c := range conns {
		c.Close()
	}
}

// StopListening closes the listening socket (new connections are refused);
// open connections stay.
func (s *Server) StopListening() {
	s.mu.Lock()
	ln := s.ln
	s.ln = nil
	s.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
}

// Listen listens again on the same address.
func (s *Server) Listen() error {
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ {
		ln, err = net.Listen("tcp", s.Addr)
		if err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.ln = ln
	s.mu.Unlock()
	go s.accept(ln)
	return nil
}

// DropAll closes every open connection.
func (s *Server) DropAll() {
	s.mu.Lock()
	conns := make([]*Conn, 0, len(s.conns))
	for _, c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

// Conns returns the open connections, by number.
func (s *Server) Conns() []*Conn {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*Conn, 0, len(s.conns))
	for _, c := range s.conns {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// SetRedirect makes the node a standby: A, R, N, C and O are answered
// "M <op> <key> <target>" ("*" for no known active); "" ends it.
func (s *Server) SetRedirect(target string) {
	s.mu.Lock()
	s.redirect = target
	s.mu.Unlock()
}

// SetStall makes the node read and record lines but answer nothing (I and
// P included), like a paused process.
func (s *Server) SetStall(on bool) {
	s.mu.Lock()
	s.stall = on
	s.mu.Unlock()
}

// SetHook lets f see every line first; when it returns true the line is
// taken care of (f may answer with c.Write later).
func (s *Server) SetHook(f func(c *Conn, line string) bool) {
	s.mu.Lock()
	s.hook = f
	s.mu.Unlock()
}

// Lines returns every line received so far.
func (s *Server) Lines() []Line {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Line(nil), s.lines...)
}

// Texts returns the text of every line received so far whose text starts
// with prefix.
func (s *Server) Texts(prefix string) []string {
	var out []string
	for _, l := range s.Lines() {
		if strings.HasPrefix(l.Text, prefix) {
			out = append(out, l.Text)
		}
	}
	return out
}

// Accepts returns when each connection was accepted.
func (s *Server) Accepts() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.accepts...)
}

// Wait waits until cond (called with the server's lines) is true, for at
// most timeout; it reports whether cond became true.
func (s *Server) Wait(timeout time.Duration, cond func(lines []Line) bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		s.mu.Lock()
		ch := s.changed
		lines := append([]Line(nil), s.lines...)
		s.mu.Unlock()
		if cond(lines) {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		t := time.NewTimer(left)
		select {
		case <-ch:
		case <-t.C:
		}
		t.Stop()
	}
}

// WaitLine waits for a received line whose text starts with prefix.
func (s *Server) WaitLine(timeout time.Duration, prefix string) (Line, bool) {
	var found Line
	ok := s.Wait(timeout, func(lines []Line) bool {
		for _, l := range lines {
			if strings.HasPrefix(l.Text, prefix) {
				found = l
				return true
			}
		}
		return false
	})
	return found, ok
}

// Held returns the tokens holding key now.
func (s *Server) Held(key string) []uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []uint64
	if k := s.keys[key]; k != nil {
		for t := range k.holders {
			out = append(out, t)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Waiting returns how many acquires wait for key.
func (s *Server) Waiting(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if k := s.keys[key]; k != nil {
		return len(k.queue)
	}
	return 0
}

// Grant makes the server grant key to nobody in particular (as another
// client would), returning the token.
func (s *Server) Grant(key, name string, lease float64) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.key(key)
	return s.grantLocked(key, k, nil, name, false, lease)
}

// Expire ends token's grant on key as an expiry would.
func (s *Server) Expire(key string, token uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.endLocked(key, token)
}

func (s *Server) serve(c *Conn) {
	r := bufio.NewReader(c.nc)
	defer func() {
		c.nc.Close()
		s.mu.Lock()
		delete(s.conns, c.ID)
		s.dropConnLocked(c)
		s.bump()
		s.mu.Unlock()
	}()
	for {
		raw, err := r.ReadString('\n')
		if err != nil {
			return
		}
		text := strings.TrimSuffix(strings.TrimSuffix(raw, "\n"), "\r")
		if text == "" {
			continue
		}
		s.mu.Lock()
		s.lines = append(s.lines, Line{Conn: c.ID, Text: text, At: time.Now()})
		s.bump()
		hook, stall := s.hook, s.stall
		s.mu.Unlock()
		if hook != nil && hook(c, text) {
			continue
		}
		if stall {
			continue
		}
		s.handle(c, text)
	}
}

func (s *Server) key(key string) *keyState {
	k := s.keys[key]
	if k == nil {
		k = &keyState{holders: map[uint64]*grant{}}
		s.keys[key] = k
	}
	return k
}

func seconds(f string) (float64, bool) {
	if f == "" {
		return 0, false
	}
	for i, ch := range f {
		if !(ch >= '0' && ch <= '9') && !(ch == '.' && i > 0 && i < len(f)-1) {
			return 0, false
		}
	}
	v, err := strconv.ParseFloat(f, 64)
	return v, err == nil
}

func dur(sec float64) time.Duration { return time.Duration(sec * float64(time.Second)) }

// Handle answers line as the node would (for hooks that pass a line on).
func (s *Server) Handle(c *Conn, line string) { s.handle(c, line) }

func (s *Server) handle(c *Conn, line string) {
	f := strings.Split(line, " ")
	s.mu.Lock()
	defer s.mu.Unlock()
	op := f[0]
	key := "*"
	if len(f) > 1 {
		key = f[1]
	}
	bad := func(msg string) { c.Write("E " + op + " " + key + " " + msg) }
	if s.redirect != "" && strings.Contains("ARNCO", op) && len(op) == 1 {
		c.Write("M " + op + " " + key + " " + s.redirect)
		return
	}
	switch op {
	case "P":
		if len(f) != 2 {
			bad("bad request")
			return
		}
		c.Write(line)
	case "I":
		if len(f) != 2 || f[1] == "-" {
			bad("bad name")
			return
		}
		c.name = f[1]
		c.Write(line)
	case "A":
		if len(f) != 4 && len(f) != 5 {
			bad("bad request")
			return
		}
		lease, ok1 := seconds(f[2])
		wait, ok2 := seconds(f[3])
		if !ok1 || !ok2 || lease <= 0 {
			bad("bad lease or wait")
			return
		}
		read, slots := false, 0
		if len(f) == 5 {
			switch {
			case f[4] == "r":
				read = true
			default:
				n, err := strconv.Atoi(f[4])
				if err != nil || n < 1 || n > 65535 || f[4][0] == '0' {
					bad("bad share")
					return
				}
				if n > 1 {
					slots = n
				}
			}
		}
		k := s.key(key)
		if len(k.holders) == 0 && len(k.queue) == 0 {
			k.slots = slots
		} else if k.slots != slots || (slots > 0 && read) {
			bad("share does not match the key")
			return
		}
		w := &waiter{conn: c, read: read, lease: lease}
		if len(k.queue) == 0 && s.fits(k, w) {
			s.grantLocked(key, k, c, c.name, read, lease)
			return
		}
		k.queue = append(k.queue, w)
		if wait > 0 {
			w.timer = time.AfterFunc(dur(wait), func() {
				s.mu.Lock()
				defer s.mu.Unlock()
				if s.removeWaiter(key, w) {
					c.Write("T " + key)
					s.serveLocked(key)
				}
			})
		}
	case "R":
		if len(f) != 3 {
			bad("bad request")
			return
		}
		t, err := strconv.ParseUint(f[2], 10, 64)
		k := s.keys[key]
		if err != nil || k == nil || k.holders[t] == nil {
			c.Write("R " + key + " STALE")
			return
		}
		s.endLocked(key, t)
		c.Write("R " + key + " OK")
	case "N":
		if len(f) != 4 {
			bad("bad request")
			return
		}
		t, err := strconv.ParseUint(f[2], 10, 64)
		lease, ok := seconds(f[3])
		if !ok || lease <= 0 {
			bad("bad lease")
			return
		}
		k := s.keys[key]
		if err != nil || k == nil || k.holders[t] == nil {
			c.Write("N " + key + " STALE")
			return
		}
		g := k.holders[t]
		g.timer.Reset(dur(lease))
		c.Write("N " + key + " OK")
	case "C":
		if len(f) != 2 {
			bad("bad request")
			return
		}
		k := s.keys[key]
		if k != nil {
			for _, w := range k.queue {
				if w.conn == c {
					s.removeWaiter(key, w)
					c.Write("T " + key)
					c.Write("C " + key + " OK")
					s.serveLocked(key)
					return
				}
			}
		}
		c.Write("C " + key + " NONE")
	case "O":
		if len(f) != 4 {
			bad("bad request")
			return
		}
		wait, ok := seconds(f[3])
		if !ok {
			bad("bad wait")
			return
		}
		k := s.key(key)
		newest, holder := s.newest(k)
		if f[2] == "?" || !sameToken(f[2], newest) {
			c.Write("O " + key + " " + strconv.FormatUint(newest, 10) + " " + holder)
			s.gc(key)
			return
		}
		o := &observer{conn: c, since: f[2]}
		k.observers = append(k.observers, o)
		if wait > 0 {
			o.timer = time.AfterFunc(dur(wait), func() {
				s.mu.Lock()
				defer s.mu.Unlock()
				k := s.keys[key]
				if k == nil {
					return
				}
				for i, x := range k.observers {
					if x == o {
						k.observers = append(k.observers[:i], k.observers[i+1:]...)
						n, h := s.newest(k)
						c.Write("O " + key + " " + strconv.FormatUint(n, 10) + " " + h)
						s.gc(key)
						return
					}
				}
			})
		}
	default:
		c.Write("E * " + key + " unknown op")
	}
}

func sameToken(sent string, t uint64) bool {
	v, err := strconv.ParseUint(sent, 10, 64)
	return err == nil && v == t
}

func (s *Server) newest(k *keyState) (uint64, string) {
	var best uint64
	name := "-"
	for t, g := range k.holders {
		if t > best {
			best = t
			name = g.name
			if name == "" {
				name = "-"
			}
		}
	}
	return best, name
}

func (s *Server) fits(k *keyState, w *waiter) bool {
	if k.slots > 0 {
		return len(k.holders) < k.slots
	}
	if w.read {
		for _, g := range k.holders {
			if !g.read {
				return false
			}
		}
		return true
	}
	return len(k.holders) == 0
}

func (s *Server) grantLocked(key string, k *keyState, c *Conn, name string, read bool, lease float64) uint64 {
	s.token++
	t := s.token
	g := &grant{token: t, name: name, read: read}
	g.timer = time.AfterFunc(dur(lease), func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.endLocked(key, t)
	})
	k.holders[t] = g
	if c != nil {
		c.Write("A " + key + " " + strconv.FormatUint(t, 10))
	}
	s.notify(key, k)
	return t
}

// endLocked ends a grant (release or expiry) and serves the queue.
func (s *Server) endLocked(key string, t uint64) {
	k := s.keys[key]
	if k == nil || k.holders[t] == nil {
		return
	}
	k.holders[t].timer.Stop()
	delete(k.holders, t)
	s.serveLocked(key)
	s.notify(key, k)
	s.gc(key)
}

func (s *Server) serveLocked(key string) {
	k := s.keys[key]
	if k == nil {
		return
	}
	for len(k.queue) > 0 && s.fits(k, k.queue[0]) {
		w := k.queue[0]
		k.queue = k.queue[1:]
		if w.timer != nil {
			w.timer.Stop()
		}
		s.grantLocked(key, k, w.conn, w.conn.name, w.read, w.lease)
	}
	s.gc(key)
}

func (s *Server) notify(key string, k *keyState) {
	newest, holder := s.newest(k)
	kept := k.observers[:0]
	for _, o := range k.observers {
		if sameToken(o.since, newest) {
			kept = append(kept, o)
			continue
		}
		if o.timer != nil {
			o.timer.Stop()
		}
		o.conn.Write("O " + key + " " + strconv.FormatUint(newest, 10) + " " + holder)
	}
	k.observers = kept
}

func (s *Server) removeWaiter(key string, w *waiter) bool {
	k := s.keys[key]
	if k == nil {
		return false
	}
	for i, x := range k.queue {
		if x == w {
			if w.timer != nil {
				w.timer.Stop()
			}
			k.queue = append(k.queue[:i], k.queue[i+1:]...)
			return true
		}
	}
	return false
}

func (s *Server) gc(key string) {
	if k := s.keys[key]; k != nil && len(k.holders) == 0 && len(k.queue) == 0 && len(k.observers) == 0 {
		delete(s.keys, key)
	}
}

func (s *Server) dropConnLocked(c *Conn) {
	for key, k := range s.keys {
		kept := k.queue[:0]
		for _, w := range k.queue {
			if w.conn == c {
				if w.timer != nil {
					w.timer.Stop()
				}
				continue
			}
			kept = append(kept, w)
		}
		k.queue = kept
		obs := k.observers[:0]
		for _, o := range k.observers {
			if o.conn == c {
				if o.timer != nil {
					o.timer.Stop()
				}
				continue
			}
			obs = append(obs, o)
		}
		k.observers = obs
		s.serveLocked(key)
	}
}
