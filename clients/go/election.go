package lockservice

import (
	"context"
	"strconv"
	"time"
)

// Leadership is this client's leadership of an election, won by Campaign.
// Its token fences what the leader does; losing its lease is losing the
// leadership (Lost).
type Leadership struct {
	election string
	value    string
	lock     *Lock
	pool     *pool
}

// Election is the election's name (its key).
func (l *Leadership) Election() string { return l.election }

// Value is the value this client campaigned with.
func (l *Leadership) Value() string { return l.value }

// Token is the leadership's fencing token.
func (l *Leadership) Token() uint64 { return l.lock.token }

// TokenString is the token in decimal.
func (l *Leadership) TokenString() string { return l.lock.TokenString() }

// Lost is closed the moment the leadership can no longer be trusted (its
// renewal was refused, or its lease ran out while renewals failed).
func (l *Leadership) Lost() <-chan struct{} { return l.lock.Lost() }

// Err is why the leadership was lost (kind ErrLost), or nil.
func (l *Leadership) Err() error { return l.lock.Err() }

// Resign gives the leadership up (releases the election key; see
// Lock.Release).
func (l *Leadership) Resign(ctx context.Context) error {
	err := l.lock.Release(ctx)
	if err != nil && errorIs(err, ErrStale) {
		return nil // not leading anyway
	}
	return err
}

// Leader is who leads an election.
type Leader struct {
	// Value is the leader's value, "" when nobody leads (or when the
	// leader's connection had no name).
	Value string
	// Token is the leadership's fencing token, 0 when nobody leads.
	Token uint64
}

// checkValue: a value must be a name's value once "#<instance id>" is added.
func checkValue(value string) bool {
	return validKey(value) && len(value) <= MaxKey-1-instanceHex
}

// Campaign stands for leader of election with value (an address, an id):
// it acquires the election key (wait 0, keep-alive on) on connections whose
// name's value is value, and returns once this client leads, with the
// leadership's fencing token. Cancel ctx to stop campaigning (the queued
// acquire is withdrawn). Errors: ErrInvalid (a bad election, value or lease),
// ErrRejected, ErrNoConnection, ErrCancelled.
func (c *Client) Campaign(ctx context.Context, election, value string, lease time.Duration) (*Leadership, error) {
	if lease <= 0 {
		return nil, newError(ErrInvalid, "campaign", election, "lease must be > 0")
	}
	return c.CampaignSeconds(ctx, election, value, SecondsOf(lease))
}

// CampaignSeconds is Campaign with the lease as Seconds (see Seconds).
func (c *Client) CampaignSeconds(ctx context.Context, election, value string, lease Seconds) (*Leadership, error) {
	if !checkValue(value) {
		return nil, newError(ErrInvalid, "campaign", election, "bad value "+strconv.Quote(value)+
			": 1-237 bytes of UTF-8, no spaces or control characters")
	}
	o := AcquireOptions{LeaseSeconds: lease, KeepAlive: true}
	share, err := checkAcquire("campaign", election, o)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, newError(ErrNoConnection, "campaign", election, "client closed")
	}
	p := newPool(c.addrs, value+"#"+c.instance, c.opts.tls, c.opts.dial)
	c.pools[p] = struct{}{}
	c.mu.Unlock()
	drop := func() {
		c.mu.Lock()
		delete(c.pools, p)
		c.mu.Unlock()
		p.close()
	}
	l, err := c.acquire(ctx, p, "campaign", election, share, o)
	if err != nil {
		// Let a withdrawal's answers and a crossed grant's release finish.
		time.AfterFunc(withdrawFor+ReleaseRetryFor, drop)
		return nil, err
	}
	l.mu.Lock()
	if l.released || l.lostErr != nil {
		l.mu.Unlock()
		go drop()
	} else {
		l.onEnd = func() {
			// The release (or the last renewals) may still need the pool.
			time.AfterFunc(ReleaseRetryFor+time.Second, drop)
		}
		l.mu.Unlock()
	}
	return &Leadership{election: election, value: value, lock: l, pool: p}, nil
}

// Leader returns who leads election now ("O election ? 0"): the leader's
// value and token, or a zero Leader when nobody leads.
func (c *Client) Leader(ctx context.Context, election string) (Leader, error) {
	st, err := c.observeOnce(ctx, "leader", election, "?", 0)
	if err != nil {
		return Leader{}, err
	}
	if st.Token == 0 {
		return Leader{}, nil
	}
	return Leader{Value: st.Value(), Token: st.Token}, nil
}
