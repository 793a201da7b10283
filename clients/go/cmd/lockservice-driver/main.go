// Command lockservice-driver is the Go client's conformance driver (the
// "Conformance driver" of docs/protocol.md): JSON-lines commands on stdin, results and
// events on stdout, run concurrently.
//
//	lockservice-driver --addrs HOST:PORT[,HOST:PORT...] [--name NAME]
//	    [--tls-ca FILE [--tls-cert FILE --tls-key FILE]]
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	lockservice "github.com/lockservice/lockservice/clients/go"
)

func usage(msg string) {
	fmt.Fprintln(os.Stderr, "lockservice-driver: "+msg)
	os.Exit(2)
}

func main() {
	fs := flag.NewFlagSet("lockservice-driver", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	addrs := fs.String("addrs", "", "")
	name := fs.String("name", "", "")
	caFile := fs.String("tls-ca", "", "")
	certFile := fs.String("tls-cert", "", "")
	keyFile := fs.String("tls-key", "", "")
	if err := fs.Parse(os.Args[1:]); err != nil {
		usage(strings.ReplaceAll(err.Error(), "\n", " ") +
			"; usage: --addrs HOST:PORT[,HOST:PORT...] [--name NAME] [--tls-ca FILE [--tls-cert FILE --tls-key FILE]]")
	}
	if fs.NArg() > 0 {
		usage("unexpected argument " + strconv.Quote(fs.Arg(0)))
	}
	if *addrs == "" {
		usage("--addrs HOST:PORT[,HOST:PORT...] is required")
	}
	var list []string
	for _, a := range strings.Split(*addrs, ",") {
		host, port, err := net.SplitHostPort(a)
		if err != nil || host == "" || port == "" {
			usage("bad address " + strconv.Quote(a) + " in --addrs (want HOST:PORT)")
		}
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			usage("bad port in " + strconv.Quote(a))
		}
		list = append(list, a)
	}
	opts := []lockservice.Option{lockservice.WithBackgroundConnect()}
	if *name != "" {
		opts = append(opts, lockservice.WithName(*name))
	}
	if (*certFile == "") != (*keyFile == "") {
		usage("--tls-cert and --tls-key go together")
	}
	if *certFile != "" && *caFile == "" {
		usage("--tls-cert needs --tls-ca")
	}
	if *caFile != "" {
		pem, err := os.ReadFile(*caFile)
		if err != nil {
			usage("cannot read --tls-ca: " + err.Error())
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			usage("no certificate in --tls-ca " + *caFile)
		}
		cfg := &tls.Config{RootCAs: pool}
		if *certFile != "" {
			cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
			if err != nil {
				usage("cannot load --tls-cert/--tls-key: " + err.Error())
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, lockservice.WithTLS(cfg))
	}
	client, err := lockservice.Dial(context.Background(), list, opts...)
	if err != nil {
		usage(err.Error())
	}
	d := newDriver(client, os.Stdout)
	d.run(os.Stdin)
	os.Exit(0)
}

func newDriver(client *lockservice.Client, out io.Writer) *driver {
	d := &driver{client: client, out: out, pending: map[string]*task{},
		held: map[heldKey]*held{}, leaders: map[string]*held{}}
	d.stop, d.stopNow = context.WithCancel(context.Background())
	return d
}

type heldKey struct {
	key   string
	token uint64
}

// held is a lock (or leadership) the driver holds.
type held struct {
	lock     *lockservice.Lock
	lead     *lockservice.Leadership
	key      string
	token    uint64
	released chan struct{}
	once     sync.Once
}

func (h *held) stop() { h.once.Do(func() { close(h.released) }) }

func (h *held) release(ctx context.Context) error {
	h.stop()
	if h.lead != nil {
		return h.lead.Resign(ctx)
	}
	return h.lock.Release(ctx)
}

// task is a command running.
type task struct {
	id        json.RawMessage
	op        string
	cancel    context.CancelFunc
	done      chan struct{}
	cancelled bool // a cancel (or close) asked for it; d.mu
}

type driver struct {
	client *lockservice.Client
	out    io.Writer

	mu      sync.Mutex // guards the maps and every write to out
	pending map[string]*task
	held    map[heldKey]*held
	leaders map[string]*held
	closing bool
	wg      sync.WaitGroup

	// stop ends at the close's deadline: what still runs then (a release
	// of a grant that crossed a cancel) gives up.
	stop     context.Context
	stopNow  context.CancelFunc
	stopOnce sync.Once
}

// field is one key/value of an output line, kept in order.
type field struct {
	k string
	v any
}

func encode(fields []field) []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, f := range fields {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(f.k)
		b.Write(k)
		b.WriteByte(':')
		if raw, ok := f.v.(json.RawMessage); ok {
			if len(raw) == 0 {
				b.WriteString("null")
			} else {
				b.Write(raw)
			}
			continue
		}
		v, _ := json.Marshal(f.v)
		b.Write(v)
	}
	b.WriteString("}\n")
	return b.Bytes()
}

// writeLocked writes one line; d.mu held.
func (d *driver) writeLocked(fields []field) {
	d.out.Write(encode(fields))
}

func (d *driver) write(fields []field) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.writeLocked(fields)
}

func idKey(raw json.RawMessage) string {
	var s string
	if len(raw) > 0 && raw[0] == '"' {
		if json.Unmarshal(raw, &s) == nil {
			return "s:" + s
		}
	}
	var n json.Number
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if dec.Decode(&n) == nil {
		if i, err := strconv.ParseInt(n.String(), 10, 64); err == nil {
			return "n:" + strconv.FormatInt(i, 10)
		}
		return "n:" + n.String()
	}
	return "?:" + string(raw)
}

func errCode(err error) string {
	switch {
	case errors.Is(err, lockservice.ErrCancelled):
		return "cancelled"
	case errors.Is(err, lockservice.ErrTimeout):
		return "timeout"
	case errors.Is(err, lockservice.ErrStale):
		return "stale"
	case errors.Is(err, lockservice.ErrRejected):
		return "rejected"
	case errors.Is(err, lockservice.ErrInvalid):
		return "invalid"
	case errors.Is(err, lockservice.ErrLost):
		return "stale"
	default:
		return "no_connection"
	}
}

func failure(id json.RawMessage, code, msg string) []field {
	return []field{{"id", id}, {"ok", false}, {"error", code}, {"message", msg}}
}

// cmdError is a command refused before it ran.
type cmdError struct{ code, msg string }

func badCommand(msg string) *cmdError { return &cmdError{"bad_command", msg} }
func invalid(msg string) *cmdError    { return &cmdError{"invalid", msg} }

// command is one parsed input line.
type command map[string]json.RawMessage

func (c command) has(k string) bool {
	v, ok := c[k]
	return ok && string(v) != "null"
}

func (c command) str(k string) (string, *cmdError) {
	v, ok := c[k]
	if !ok || string(v) == "null" {
		return "", badCommand("missing field " + strconv.Quote(k))
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", badCommand("field " + strconv.Quote(k) + " must be a string")
	}
	return s, nil
}

func (c command) key(k string) (string, *cmdError) {
	s, e := c.str(k)
	if e != nil {
		return "", e
	}
	if !validKey(s) {
		return "", invalid("bad " + k + " " + strconv.Quote(s) + ": 1-250 bytes of UTF-8, no spaces or control characters")
	}
	return s, nil
}

// seconds reads field k, a JSON number of seconds, exactly (the wire gets
// it to the microsecond whatever its size: a value beyond the node's
// maxima is the node's to refuse).
func (c command) seconds(k string) (lockservice.Seconds, *cmdError) {
	v, ok := c[k]
	if !ok || string(v) == "null" {
		return lockservice.Seconds{}, badCommand("missing field " + strconv.Quote(k))
	}
	if !isNumber(v) {
		return lockservice.Seconds{}, badCommand("field " + strconv.Quote(k) + " must be a number")
	}
	s, err := lockservice.ParseSeconds(string(v))
	if err != nil {
		return lockservice.Seconds{}, invalid(k + " must be a finite number of seconds >= 0: " + string(v))
	}
	return s, nil
}

// isNumber: raw is a JSON number (not a string holding one).
func isNumber(raw json.RawMessage) bool {
	return len(raw) > 0 && (raw[0] == '-' || (raw[0] >= '0' && raw[0] <= '9'))
}

// isIntOrString: raw is a JSON string or a JSON integer (a number with no
// fraction or exponent), what an id or a cancel's target may be.
func isIntOrString(raw json.RawMessage) bool {
	if len(raw) > 0 && raw[0] == '"' {
		return true
	}
	return isNumber(raw) && !bytes.ContainsAny(raw, ".eE")
}

func (c command) lease(k string) (lockservice.Seconds, *cmdError) {
	s, e := c.seconds(k)
	if e != nil {
		return s, e
	}
	if s.IsZero() {
		return s, invalid(k + " must be > 0 seconds")
	}
	return s, nil
}

func (c command) wait() (lockservice.Seconds, *cmdError) {
	return c.seconds("wait")
}

func (c command) token(k string) (uint64, *cmdError) {
	s, e := c.str(k)
	if e != nil {
		return 0, e
	}
	t, err := lockservice.ParseToken(s)
	if err != nil {
		return 0, invalid("bad token " + strconv.Quote(s) + ": decimal digits, at most 2^64-1")
	}
	return t, nil
}

func (c command) share() (lockservice.Share, *cmdError) {
	v, ok := c["share"]
	if !ok || string(v) == "null" {
		return lockservice.Exclusive, nil
	}
	if v[0] == '"' {
		var s string
		json.Unmarshal(v, &s)
		if s == "r" {
			return lockservice.Read, nil
		}
		return 0, invalid("bad share " + strconv.Quote(s) + ": null, \"r\" or an integer 1..65535")
	}
	var n json.Number
	dec := json.NewDecoder(bytes.NewReader(v))
	dec.UseNumber()
	if err := dec.Decode(&n); err != nil {
		return 0, badCommand("share must be null, \"r\" or an integer")
	}
	i, err := strconv.ParseInt(n.String(), 10, 64)
	if err != nil || i < 1 || i > lockservice.MaxSlots {
		return 0, invalid("bad share " + n.String() + ": an integer 1..65535")
	}
	return lockservice.Semaphore(int(i)), nil
}

func (c command) keepalive() (bool, *cmdError) {
	v, ok := c["keepalive"]
	if !ok || string(v) == "null" {
		return false, nil
	}
	var b bool
	if err := json.Unmarshal(v, &b); err != nil {
		return false, badCommand("keepalive must be true or false")
	}
	return b, nil
}

func validKey(s string) bool {
	if len(s) == 0 || len(s) > lockservice.MaxKey || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r == ' ' || r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			return false
		}
	}
	return true
}

func (d *driver) run(in io.Reader) {
	r := bufio.NewReaderSize(in, 64<<10)
	for {
		line, err := r.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			if d.handle(line) {
				return
			}
		}
		if err != nil {
			d.shutdown(nil)
			return
		}
	}
}

// handle runs one command line; true when the driver is done (close).
func (d *driver) handle(line []byte) bool {
	var c command
	if err := json.Unmarshal(line, &c); err != nil || c == nil {
		d.write(failure(nil, "bad_command", "not a JSON object"))
		return false
	}
	id := c["id"]
	if !isIntOrString(id) {
		d.write(failure(nil, "bad_command", "missing or bad id (an integer or a string)"))
		return false
	}
	op, e := c.str("op")
	if e != nil {
		d.write(failure(id, "bad_command", e.msg))
		return false
	}
	switch op {
	case "close":
		d.shutdown(id)
		return true
	case "cancel":
		target, ok := c["target"]
		if !ok || string(target) == "null" {
			d.write(failure(id, "bad_command", "missing field \"target\""))
			return false
		}
		if !isIntOrString(target) {
			d.write(failure(id, "bad_command", "field \"target\" must be an integer or a string"))
			return false
		}
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			d.cancel(id, target)
		}()
		return false
	case "acquire", "release", "renew", "observe", "campaign", "leader", "resign":
	default:
		d.write(failure(id, "bad_command", "unknown op "+strconv.Quote(op)))
		return false
	}
	run, ce := d.prepare(op, c)
	if ce != nil {
		d.write(failure(id, ce.code, ce.msg))
		return false
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &task{id: id, op: op, cancel: cancel, done: make(chan struct{})}
	k := idKey(id)
	d.mu.Lock()
	d.pending[k] = t
	d.mu.Unlock()
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer close(t.done)
		defer cancel()
		run(ctx, t, func(fields []field, after func()) {
			// Settle: leave the pending set and write the result at once,
			// so that a cancel sees either a pending task or a written
			// result.
			d.mu.Lock()
			if d.pending[k] == t {
				delete(d.pending, k)
			}
			d.writeLocked(append([]field{{"id", id}}, fields...))
			d.mu.Unlock()
		})
	}()
	return false
}

type settleFunc func(fields []field, after func())

type runner func(ctx context.Context, t *task, settle settleFunc)

func fail(err error) []field {
	return []field{{"ok", false}, {"error", errCode(err)}, {"message", err.Error()}}
}

func (d *driver) wasCancelled(t *task) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return t.cancelled
}

// prepare checks a command's fields and returns what runs it.
func (d *driver) prepare(op string, c command) (runner, *cmdError) {
	switch op {
	case "acquire":
		key, e := c.key("key")
		if e != nil && e.code == "bad_command" {
			return nil, e
		}
		lease, e2 := c.lease("lease")
		if e2 != nil && e2.code == "bad_command" {
			return nil, e2
		}
		wait, e3 := c.wait()
		if e3 != nil && e3.code == "bad_command" {
			return nil, e3
		}
		share, e4 := c.share()
		if e4 != nil && e4.code == "bad_command" {
			return nil, e4
		}
		keep, e5 := c.keepalive()
		if e5 != nil {
			return nil, e5
		}
		for _, x := range []*cmdError{e, e2, e3, e4} {
			if x != nil {
				return nil, x
			}
		}
		o := lockservice.AcquireOptions{LeaseSeconds: lease, WaitSeconds: wait, Share: share, KeepAlive: keep}
		return func(ctx context.Context, t *task, settle settleFunc) {
			l, err := d.client.Acquire(ctx, key, o)
			if err != nil {
				settle(fail(err), nil)
				return
			}
			h := &held{lock: l, key: key, token: l.Token(), released: make(chan struct{})}
			d.mu.Lock()
			late := t.cancelled
			if !late {
				d.held[heldKey{key, l.Token()}] = h
			}
			d.mu.Unlock()
			settle([]field{{"ok", true}, {"token", l.TokenString()}}, nil)
			if late {
				// The grant came first; the cancel then releases it.
				rctx, cancel := context.WithTimeout(d.stop, lockservice.ReleaseRetryFor+time.Second)
				l.Release(rctx)
				cancel()
				return
			}
			if keep {
				go d.watchLost(h, key)
			}
		}, nil
	case "release", "renew":
		key, e := c.key("key")
		if e != nil && e.code == "bad_command" {
			return nil, e
		}
		token, e2 := c.token("token")
		if e2 != nil && e2.code == "bad_command" {
			return nil, e2
		}
		var lease lockservice.Seconds
		var e3 *cmdError
		if op == "renew" {
			lease, e3 = c.lease("lease")
			if e3 != nil && e3.code == "bad_command" {
				return nil, e3
			}
		}
		for _, x := range []*cmdError{e, e2, e3} {
			if x != nil {
				return nil, x
			}
		}
		if op == "release" {
			return func(ctx context.Context, t *task, settle settleFunc) {
				d.mu.Lock()
				h := d.held[heldKey{key, token}]
				d.mu.Unlock()
				var err error
				if h != nil {
					err = h.release(ctx)
				} else {
					err = d.client.ReleaseToken(ctx, key, token)
				}
				if h != nil && !errors.Is(err, lockservice.ErrNoConnection) && !errors.Is(err, lockservice.ErrCancelled) {
					d.mu.Lock()
					delete(d.held, heldKey{key, token})
					d.mu.Unlock()
				}
				if err != nil {
					settle(fail(err), nil)
					return
				}
				settle([]field{{"ok", true}}, nil)
			}, nil
		}
		return func(ctx context.Context, t *task, settle settleFunc) {
			d.mu.Lock()
			h := d.held[heldKey{key, token}]
			d.mu.Unlock()
			var err error
			if h != nil && h.lock != nil {
				err = h.lock.RenewSeconds(ctx, lease)
			} else {
				err = d.client.RenewTokenSeconds(ctx, key, token, lease)
			}
			if err != nil {
				settle(fail(err), nil)
				return
			}
			settle([]field{{"ok", true}}, nil)
		}, nil
	case "observe":
		key, e := c.key("key")
		if e != nil && e.code == "bad_command" {
			return nil, e
		}
		since := "?"
		var e2 *cmdError
		if c.has("token") {
			var s string
			s, e2 = c.str("token")
			if e2 != nil {
				return nil, e2
			}
			if s != "?" {
				if _, err := lockservice.ParseToken(s); err != nil {
					e2 = invalid("bad token " + strconv.Quote(s))
				}
			}
			since = s
		}
		wait, e3 := c.wait()
		if e3 != nil && e3.code == "bad_command" {
			return nil, e3
		}
		for _, x := range []*cmdError{e, e2, e3} {
			if x != nil {
				return nil, x
			}
		}
		return func(ctx context.Context, t *task, settle settleFunc) {
			var st lockservice.State
			var err error
			if since == "?" {
				st, err = d.client.Holder(ctx, key)
			} else {
				tok, _ := lockservice.ParseToken(since)
				st, err = d.client.WaitChange(ctx, key, tok, wait.Duration())
			}
			var holder any
			if st.Holder != "" {
				holder = st.Holder
			}
			if err != nil {
				f := fail(err)
				if errors.Is(err, lockservice.ErrTimeout) {
					f = append(f, field{"token", strconv.FormatUint(st.Token, 10)}, field{"holder", holder})
				}
				settle(f, nil)
				return
			}
			settle([]field{{"ok", true}, {"token", strconv.FormatUint(st.Token, 10)}, {"holder", holder}}, nil)
		}, nil
	case "campaign":
		election, e := c.key("election")
		if e != nil && e.code == "bad_command" {
			return nil, e
		}
		value, e2 := c.str("value")
		if e2 != nil {
			return nil, e2
		}
		// The lease may be left out: a leadership's lease is 10 s by
		// default in every official client.
		lease := lockservice.SecondsOf(10 * time.Second)
		var e3 *cmdError
		if raw, given := c["lease"]; given && string(raw) != "null" {
			lease, e3 = c.lease("lease")
		}
		if e3 != nil && e3.code == "bad_command" {
			return nil, e3
		}
		for _, x := range []*cmdError{e, e3} {
			if x != nil {
				return nil, x
			}
		}
		return func(ctx context.Context, t *task, settle settleFunc) {
			lead, err := d.client.CampaignSeconds(ctx, election, value, lease)
			if err != nil {
				settle(fail(err), nil)
				return
			}
			h := &held{lead: lead, key: election, token: lead.Token(), released: make(chan struct{})}
			d.mu.Lock()
			late := t.cancelled
			if !late {
				d.leaders[election] = h
			}
			d.mu.Unlock()
			settle([]field{{"ok", true}, {"token", lead.TokenString()}}, nil)
			if late {
				rctx, cancel := context.WithTimeout(d.stop, lockservice.ReleaseRetryFor+time.Second)
				lead.Resign(rctx)
				cancel()
				return
			}
			go d.watchLost(h, election)
		}, nil
	case "leader":
		election, e := c.key("election")
		if e != nil {
			return nil, e
		}
		return func(ctx context.Context, t *task, settle settleFunc) {
			st, err := d.client.Holder(ctx, election)
			if err != nil {
				settle(fail(err), nil)
				return
			}
			var value any
			if st.Token != 0 && st.Holder != "" {
				value = st.Value()
			}
			settle([]field{{"ok", true}, {"value", value}, {"token", strconv.FormatUint(st.Token, 10)}}, nil)
		}, nil
	case "resign":
		election, e := c.key("election")
		if e != nil {
			return nil, e
		}
		return func(ctx context.Context, t *task, settle settleFunc) {
			d.mu.Lock()
			h := d.leaders[election]
			d.mu.Unlock()
			if h != nil {
				if err := h.release(ctx); err != nil {
					settle(fail(err), nil)
					return
				}
				d.mu.Lock()
				if d.leaders[election] == h {
					delete(d.leaders, election)
				}
				d.mu.Unlock()
			}
			settle([]field{{"ok", true}}, nil)
		}, nil
	}
	return nil, badCommand("unknown op")
}

// watchLost writes the lost event of a kept-alive lock or a leadership.
func (d *driver) watchLost(h *held, key string) {
	var lost <-chan struct{}
	if h.lead != nil {
		lost = h.lead.Lost()
	} else {
		lost = h.lock.Lost()
	}
	select {
	case <-lost:
	case <-h.released:
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if h.lead != nil {
		if d.leaders[key] == h {
			delete(d.leaders, key)
		}
	} else {
		delete(d.held, heldKey{h.key, h.token})
	}
	d.writeLocked([]field{{"event", "lost"}, {"key", key}, {"token", strconv.FormatUint(h.token, 10)}})
}

func (d *driver) cancel(id, target json.RawMessage) {
	k := idKey(target)
	d.mu.Lock()
	t := d.pending[k]
	if t == nil || (t.op != "acquire" && t.op != "observe" && t.op != "campaign") {
		d.writeLocked(failure(id, "unknown_target", "no pending acquire, observe or campaign with that id"))
		d.mu.Unlock()
		return
	}
	t.cancelled = true
	d.mu.Unlock()
	t.cancel()
	<-t.done
	d.write([]field{{"id", id}, {"ok", true}})
}

// shutdown ends every pending command (cancelled) and releases what is held
// (best effort), all at once and within one deadline of 5 s, then writes
// close's answer when id is set.
func (d *driver) shutdown(id json.RawMessage) {
	deadline := time.Now().Add(lockservice.ReleaseRetryFor)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	stopAt := time.AfterFunc(lockservice.ReleaseRetryFor, d.stopNow)
	defer stopAt.Stop()
	d.mu.Lock()
	d.closing = true
	tasks := make([]*task, 0, len(d.pending))
	for _, t := range d.pending {
		t.cancelled = true
		tasks = append(tasks, t)
	}
	var hs []*held
	for _, h := range d.held {
		hs = append(hs, h)
	}
	for _, h := range d.leaders {
		hs = append(hs, h)
	}
	d.held = map[heldKey]*held{}
	d.leaders = map[string]*held{}
	d.mu.Unlock()
	// The releases' windows run while the pending commands are withdrawn.
	var wg sync.WaitGroup
	for _, h := range hs {
		wg.Add(1)
		go func(h *held) {
			defer wg.Done()
			h.release(ctx)
		}(h)
	}
	for _, t := range tasks {
		t.cancel()
	}
	for _, t := range tasks {
		select {
		case <-t.done:
		case <-ctx.Done():
		}
	}
	wg.Wait()
	d.stopNow()
	d.client.Close()
	if id != nil {
		d.write([]field{{"id", id}, {"ok", true}})
	}
}
