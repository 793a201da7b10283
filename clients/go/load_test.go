package lockservice

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Many pipelined requests on two connections: every line reaches the node
// whole (a writer that reused its buffer once mixed lines under load).
func TestPipelinedLoadLinesIntact(t *testing.T) {
	s := startFake(t)
	c := dialT(t, []string{s.Addr})
	ctx := ctxT(t)
	var wg sync.WaitGroup
	stop := time.Now().Add(1500 * time.Millisecond)
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func(key string) {
			defer wg.Done()
			for time.Now().Before(stop) {
				l, err := c.Acquire(ctx, key, AcquireOptions{Lease: 30 * time.Second, Wait: 10 * time.Second})
				if err != nil {
					t.Error(err)
					return
				}
				if err := l.Release(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}("bench/" + strconv.Itoa(i))
	}
	wg.Wait()
	n := 0
	for _, l := range s.Lines() {
		f := strings.Split(l.Text, " ")
		if (f[0] == "A" && len(f) != 4) || (f[0] == "R" && len(f) != 3) {
			if n < 10 {
				t.Errorf("bad line %q", l.Text)
			}
			n++
		}
	}
	t.Logf("%d lines, %d bad", len(s.Lines()), n)
}
