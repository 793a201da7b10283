package lockservice

import (
	"context"
	"strconv"
	"sync"
	"time"
)

// Lock is a granted lock: its key and fencing token. Pass Token() to the
// protected resource so that it can refuse a late writer.
type Lock struct {
	client *Client
	pool   *pool
	key    string
	token  uint64
	lease  time.Duration // guarded by mu
	leaseS Seconds       // the same as the wire writes it; mu
	share  Share

	mu         sync.Mutex
	expires    time.Time
	keepAlive  bool
	renewTimer *time.Timer
	expiryT    *time.Timer
	released   bool
	lost       chan struct{}
	lostErr    error
	renewErr   error
	onEnd      func() // called once, when released or lost
}

func (c *Client) newLock(p *pool, key string, token uint64, o AcquireOptions) *Lock {
	leaseS, _ := o.seconds()
	return &Lock{client: c, pool: p, key: key, token: token, lease: leaseS.Duration(), leaseS: leaseS,
		share: o.Share, lost: make(chan struct{})}
}

// Key is the lock's key.
func (l *Lock) Key() string { return l.key }

// Token is the grant's fencing token.
func (l *Lock) Token() uint64 { return l.token }

// TokenString is the token in decimal, as the wire and JSON carry it (a
// u64 does not fit a JavaScript number).
func (l *Lock) TokenString() string { return strconv.FormatUint(l.token, 10) }

// Lease is the lease the lock was acquired (or last renewed) with.
func (l *Lock) Lease() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lease
}

// Share is how the key is held: Exclusive, Read or a semaphore's slots.
func (l *Lock) Share() Share { return l.share }

// Expires is the time until which the client is sure the server holds the
// grant (the lease counted from when the acquire or the last confirmed
// renewal was sent); zero when it cannot be sure at all.
func (l *Lock) Expires() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expires
}

// Lost is closed the moment the client can no longer be sure it holds the
// lock: a renewal was refused (STALE), or the lease ran out (while renewals
// failed, or with no renewal). It is never closed after Release was called.
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// Err is why the lock was lost (kind ErrLost), or nil.
func (l *Lock) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lostErr
}

// String is "Lock(key, token)".
func (l *Lock) String() string { return "Lock(" + l.key + ", " + l.TokenString() + ")" }

func (c *Client) hold(l *Lock, sent time.Time, keepAlive bool) {
	c.mu.Lock()
	if !c.closed {
		c.locks[l] = struct{}{}
	}
	c.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if sent.Add(l.lease).After(time.Now()) {
		l.confirmedLocked(sent, l.lease)
	}
	if keepAlive {
		l.keepAlive = true
		l.scheduleLocked()
	} else if l.expires.IsZero() {
		// The grant came after its lease, counted from the send, ran out
		// (a long wait in the queue): it cannot be trusted.
		l.loseLocked("the grant arrived after its lease had run out (counted from the acquire's send)")
	}
}

// confirmedLocked: the server holds the grant until at least sent+lease.
func (l *Lock) confirmedLocked(sent time.Time, lease time.Duration) {
	exp := sent.Add(lease)
	if !l.expires.IsZero() && !exp.After(l.expires) {
		return
	}
	l.expires = exp
	if l.expiryT != nil {
		l.expiryT.Stop()
	}
	l.expiryT = time.AfterFunc(time.Until(exp), l.expired)
}

func (l *Lock) expired() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released || l.lostErr != nil || time.Now().Before(l.expires) {
		return
	}
	why := "the lease ran out (no renewal)"
	if l.keepAlive || l.renewErr != nil {
		why = "the lease ran out while renewals failed"
		if l.renewErr != nil {
			why += " (" + l.renewErr.Error() + ")"
		}
	}
	l.loseLocked(why)
}

func (l *Lock) loseLocked(why string) {
	if l.released || l.lostErr != nil {
		return
	}
	l.lostErr = newError(ErrLost, "hold", l.key, "token "+l.TokenString()+": "+why)
	l.stopLocked()
	close(l.lost)
	l.endLocked()
}

func (l *Lock) endLocked() {
	l.client.mu.Lock()
	delete(l.client.locks, l)
	l.client.mu.Unlock()
	if f := l.onEnd; f != nil {
		l.onEnd = nil
		go f()
	}
}

func (l *Lock) stopLocked() {
	l.keepAlive = false
	if l.renewTimer != nil {
		l.renewTimer.Stop()
		l.renewTimer = nil
	}
	if l.expiryT != nil {
		l.expiryT.Stop()
		l.expiryT = nil
	}
}

func (l *Lock) stopTimers() {
	l.mu.Lock()
	l.stopLocked()
	l.mu.Unlock()
}

// scheduleLocked plans the next automatic renewal: a third of the lease
// after the last confirmed send (at once when nothing is confirmed).
func (l *Lock) scheduleLocked() {
	if !l.keepAlive || l.released || l.lostErr != nil {
		return
	}
	if l.renewTimer != nil {
		l.renewTimer.Stop()
	}
	var delay time.Duration
	if !l.expires.IsZero() {
		delay = time.Until(l.expires.Add(-(l.lease / 3) * 2))
	}
	l.renewTimer = time.AfterFunc(delay, func() {
		l.renew(context.Background(), Seconds{}, true)
	})
}

// KeepAlive turns automatic renewal on: every third of the lease, each
// renewal retried every 200 ms (across connections and redirects) until the
// lease runs out. Watch Lost.
func (l *Lock) KeepAlive() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released || l.lostErr != nil || l.keepAlive {
		return
	}
	l.keepAlive = true
	l.scheduleLocked()
}

// StopKeepAlive turns automatic renewal off.
func (l *Lock) StopKeepAlive() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.keepAlive = false
	if l.renewTimer != nil {
		l.renewTimer.Stop()
		l.renewTimer = nil
	}
}

// Renew extends the grant: it then runs lease (0: the acquire's lease) from
// when the server receives the renewal; the token does not change. An
// unanswered renewal is retried every 200 ms until the lease it means to
// extend runs out. It returns nil, or an error of kind ErrStale (the token
// no longer holds the key: the lock is lost and Lost is closed),
// ErrRejected, ErrNoConnection, ErrInvalid or ErrCancelled.
func (l *Lock) Renew(ctx context.Context, lease time.Duration) error {
	if lease < 0 {
		return newError(ErrInvalid, "renew", l.key, "lease must be > 0")
	}
	return l.renew(ctx, SecondsOf(lease), false)
}

// RenewSeconds is Renew with the lease as Seconds (see Seconds); zero is
// the acquire's lease.
func (l *Lock) RenewSeconds(ctx context.Context, lease Seconds) error {
	return l.renew(ctx, lease, false)
}

func (l *Lock) renew(ctx context.Context, leaseS Seconds, auto bool) error {
	l.mu.Lock()
	if leaseS.IsZero() {
		leaseS = l.leaseS
	}
	lease := leaseS.Duration()
	if l.released {
		l.mu.Unlock()
		return newError(ErrStale, "renew", l.key, "released")
	}
	if auto {
		l.renewTimer = nil
	}
	now := time.Now()
	giveUp := l.expires
	if giveUp.IsZero() {
		giveUp = now.Add(ReleaseRetryFor)
	}
	if giveUp.Before(now.Add(ReleaseRetryEvery)) {
		giveUp = now.Add(ReleaseRetryEvery)
	}
	l.mu.Unlock()
	line := "N " + l.key + " " + l.TokenString() + " " + leaseS.String()
	wanted := func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return !l.released
	}
	f, sent, err := l.client.retried(ctx, l.pool, "renew", 'N', l.key, line, giveUp, wanted)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		if err == nil && len(f) >= 3 && f[2] == "OK" {
			return nil
		}
		return newError(ErrStale, "renew", l.key, "released")
	}
	if err != nil {
		l.renewErr = err
		if errorIs(err, ErrRejected) {
			l.keepAlive = false
		}
		if !l.expires.After(time.Now()) {
			l.loseLocked("the lease ran out while renewals failed (" + err.Error() + ")")
		} else if l.keepAlive && !auto {
			// A manual renewal failed: keep-alive goes on as planned.
		}
		return err
	}
	if len(f) >= 3 && f[2] == "OK" {
		l.renewErr = nil
		l.lease, l.leaseS = lease, leaseS
		l.confirmedLocked(sent, lease)
		l.scheduleLocked()
		return nil
	}
	l.loseLocked("renewal refused: the token no longer holds the key (STALE)")
	return newError(ErrStale, "renew", l.key, "token "+l.TokenString()+" does not hold the key")
}

// Release gives the key back. Keep-alive stops first, and Lost will not be
// closed afterwards. The release is sent at once, then again every 200 ms
// (on another connection, across drops and redirects) until answered, for
// 5 s at most. It returns nil, or an error of kind ErrStale (the grant had
// already expired or been released), ErrNoConnection (unconfirmed after
// 5 s), ErrRejected or ErrCancelled.
func (l *Lock) Release(ctx context.Context) error {
	l.mu.Lock()
	l.released = true
	l.stopLocked()
	l.endLocked()
	l.mu.Unlock()
	return l.client.releaseToken(ctx, l.pool, l.key, l.token, "release")
}
