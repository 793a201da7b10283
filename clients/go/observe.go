package lockservice

import (
	"context"
	"strconv"
	"sync"
	"time"
)

// State is a key's state as observed: its newest live grant's token (0 when
// nothing holds it) and that grant's holder name ("" when nothing holds it
// or its connection never named itself).
type State struct {
	// Key is the observed key.
	Key string
	// Token is the newest live grant's token, 0 when the key is free.
	Token uint64
	// Holder is the name the holder's connection had at grant time
	// ("<name>#<instance id>" for official clients), "" for none.
	Holder string
}

// Held reports whether some grant holds the key.
func (s State) Held() bool { return s.Token != 0 }

// Value is the holder name's value: the part before its last '#'. For an
// election key it is the leader's value.
func (s State) Value() string { return nameValue(s.Holder) }

// observePiece is the longest wait one O asks for. An O cannot be
// withdrawn, so a longer observation is asked in pieces, each for what is
// left of it (at most this): one abandoned frees its place on the node (and
// the key's O place on its connection) within this long.
const observePiece = 10 * time.Second

// Holder returns the key's state now ("O key ? 0").
func (c *Client) Holder(ctx context.Context, key string) (State, error) {
	return c.observeOnce(ctx, "observe", key, "?", 0)
}

// WaitChange waits until the key's newest live grant is not since, or until
// wait runs out (0: no limit; ctx still bounds it), and returns the state.
// When wait runs out with nothing changed it returns the unchanged state and
// an error of kind ErrTimeout. Other errors: ErrRejected (for example too
// many observers), ErrNoConnection, ErrInvalid, ErrCancelled. It is asked
// in pieces of at most 10 s ("O key since wait", each for what is left of
// the wait), so that one given up frees its place on the node within 10 s.
func (c *Client) WaitChange(ctx context.Context, key string, since uint64, wait time.Duration) (State, error) {
	if wait < 0 {
		return State{}, newError(ErrInvalid, "observe", key, "wait must be >= 0")
	}
	return c.observeOnce(ctx, "observe", key, strconv.FormatUint(since, 10), wait)
}

// observeOnce sends "O key since piece" (since may be "?") until the state
// is not since or wait (0: no limit) runs out, following redirects and
// moving on when a connection drops.
func (c *Client) observeOnce(ctx context.Context, op, key, since string, wait time.Duration) (State, error) {
	if !validKey(key) {
		return State{}, newError(ErrInvalid, op, "", "bad key "+strconv.Quote(key))
	}
	if c.isClosed() {
		return State{}, newError(ErrNoConnection, op, key, "client closed")
	}
	p := c.pool
	start := time.Now()
	var deadline time.Time
	var hard <-chan time.Time
	if wait > 0 {
		deadline = start.Add(wait)
		t := time.NewTimer(addSat(wait, acquireGrace))
		defer t.Stop()
		hard = t.C
	}
	// The state when wait runs out with nothing changed: since, and the
	// holder an unchanged answer named.
	unchanged := State{Key: key}
	unchanged.Token, _ = ParseToken(since)
	timedOut := func() (State, error) {
		return unchanged, newError(ErrTimeout, op, key, "nothing changed within "+wait.String())
	}
	at := newAttempt(p, wait, deadline)
	sends := 0
	var noConnSince time.Time
	for {
		if err := ctx.Err(); err != nil {
			return State{}, cancelled(op, key, err)
		}
		if p.isClosed() {
			return State{}, newError(ErrNoConnection, op, key, "client closed")
		}
		now := time.Now()
		if at.noActiveOver(now) {
			return State{}, newError(ErrNoConnection, op, key, "no active node (the cluster answers M *)")
		}
		if sends > 0 && wait > 0 && !now.Before(deadline) {
			return timedOut()
		}
		changed := p.watch()
		cn, anyUp := p.pickReserved('O', key)
		if cn == nil {
			if anyUp && wait > 0 && !now.Before(deadline) {
				// Waited our turn the whole wait: nothing was seen to change.
				return timedOut()
			}
			if !anyUp {
				if noConnSince.IsZero() {
					noConnSince = now
				}
				if p.tryAll(noConnSince) || now.Sub(noConnSince) >= noConnectionFor {
					return State{}, newError(ErrNoConnection, op, key, p.lastError())
				}
			} else {
				noConnSince = time.Time{}
			}
			step := 100 * time.Millisecond
			if left := time.Until(deadline); wait > 0 && anyUp && left > 0 && left < step {
				step = left
			}
			poll := time.NewTimer(step)
			select {
			case <-changed:
			case <-poll.C:
			case <-ctx.Done():
			case <-hard:
				poll.Stop()
				return State{}, newError(ErrNoConnection, op, key, "no answer within the wait")
			}
			poll.Stop()
			continue
		}
		noConnSince = time.Time{}
		// This piece's wait: at most observePiece, and what is left of
		// the wait (the first piece asks for a short wait exactly).
		piece := observePiece
		if wait > 0 {
			left := wait
			if sends > 0 {
				left = time.Until(deadline)
			}
			if left < piece {
				piece = left
			}
			if piece < time.Microsecond {
				piece = time.Microsecond
			}
		}
		pieceWait := formatSeconds(piece)
		if since == "?" {
			pieceWait = "0" // answered at once
		}
		cl, err := cn.send('O', key, "O "+key+" "+since+" "+pieceWait, nil)
		if err != nil {
			cn.unreserve('O', key)
			continue
		}
		sends++
		// A node that does not answer a piece by its wait (and a grace)
		// is not answering.
		bound := time.NewTimer(addSat(piece, acquireGrace))
		var r reply
		select {
		case r = <-cl.ch:
		case <-ctx.Done():
			// No withdrawal exists for O: the connection keeps the key's O
			// place until the node answers (within the piece's wait).
			bound.Stop()
			go func() { <-cl.ch; cn.unreserve('O', key) }()
			return State{}, cancelled(op, key, ctx.Err())
		case <-hard:
			bound.Stop()
			go func() { <-cl.ch; cn.unreserve('O', key) }()
			return State{}, newError(ErrNoConnection, op, key, "no answer within the wait (+"+acquireGrace.String()+")")
		case <-bound.C:
			go func() { <-cl.ch; cn.unreserve('O', key) }()
			if at.stalled() {
				return State{}, newError(ErrNoConnection, op, key, "no answer within "+piece.String()+
					" (+"+acquireGrace.String()+") on "+strconv.Itoa(at.tries)+" connections")
			}
			continue
		}
		bound.Stop()
		cn.unreserve('O', key)
		if r.err != nil {
			if at.dropped(cn) {
				return State{}, newError(ErrNoConnection, op, key, "connection dropped "+strconv.Itoa(at.tries)+" times")
			}
			continue
		}
		f := r.fields
		if f[0] == "M" {
			if at.redirect(cn, f) {
				// No active node known right now: again shortly.
				if err := sleepCtx(ctx, noActiveEvery); err != nil {
					return State{}, cancelled(op, key, err)
				}
			}
			continue
		}
		at.answered()
		switch f[0] {
		case "O":
			if len(f) != 4 {
				return State{}, newError(ErrRejected, op, key, "bad answer "+joinFields(f))
			}
			token, err := ParseToken(f[2])
			if err != nil {
				return State{}, newError(ErrRejected, op, key, "bad answer "+joinFields(f))
			}
			st := State{Key: key, Token: token}
			if f[3] != "-" {
				st.Holder = f[3]
			}
			if since != "?" && token == unchanged.Token {
				// This piece ran out with nothing changed: ask again for
				// what is left, or tell the wait ran out.
				unchanged = st
				if wait > 0 && !time.Now().Before(deadline.Add(-time.Microsecond)) {
					return timedOut()
				}
				continue
			}
			return st, nil
		case "E":
			return State{}, newError(ErrRejected, op, key, message(f))
		default:
			return State{}, newError(ErrRejected, op, key, "unexpected answer "+joinFields(f))
		}
	}
}

// Observer delivers a key's state now and at each change on C, until its
// context ends or the server rejects the observation. It keeps observing
// across dropped connections, redirects and failovers.
type Observer struct {
	// C receives the state now, then each change. A slow reader misses
	// nothing but intermediate states: it gets the state as it is then.
	// C is closed when the observation ends; Err then says why.
	C <-chan State

	mu  sync.Mutex
	err error
}

// Err is why the observation ended: an error of kind ErrCancelled (its
// context ended), ErrRejected or ErrInvalid; nil while it runs.
func (o *Observer) Err() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err
}

// Observe watches key: the state now, and each change, by repeated
// "O key <last token> <wait>" (each O waits 10 s at most, then is asked
// again). Cancel ctx to stop it.
func (c *Client) Observe(ctx context.Context, key string) (*Observer, error) {
	if !validKey(key) {
		return nil, newError(ErrInvalid, "observe", "", "bad key "+strconv.Quote(key))
	}
	ch := make(chan State)
	o := &Observer{C: ch}
	go func() {
		defer close(ch)
		since := "?"
		backoff := ReleaseRetryEvery
		for {
			st, err := c.observeOnce(ctx, "observe", key, since, 0)
			if err != nil {
				switch {
				case errorIs(err, ErrCancelled), errorIs(err, ErrRejected), errorIs(err, ErrInvalid),
					c.isClosed():
					o.mu.Lock()
					o.err = err
					o.mu.Unlock()
					return
				}
				// No connection now: try again.
				if e := sleepCtx(ctx, backoff); e != nil {
					continue
				}
				if backoff < ReconnectInterval {
					backoff *= 2
				}
				continue
			}
			backoff = ReleaseRetryEvery
			select {
			case ch <- st:
				since = strconv.FormatUint(st.Token, 10)
			case <-ctx.Done():
				o.mu.Lock()
				o.err = cancelled("observe", key, ctx.Err())
				o.mu.Unlock()
				return
			}
		}
	}()
	return o, nil
}
