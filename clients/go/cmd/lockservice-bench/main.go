// Command lockservice-bench measures the Go client: N concurrent lockers,
// each on its own key, do acquire+release pairs for D seconds against one
// address, then one JSON line gives the pairs per second and this process's
// CPU seconds per pair (user+system, from getrusage).
//
//	lockservice-bench --addr 127.0.0.1:7700 --concurrency 16 --duration 5
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	lockservice "github.com/lockservice/lockservice/clients/go"
)

func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

func main() {
	fs := flag.NewFlagSet("lockservice-bench", flag.ContinueOnError)
	addr := fs.String("addr", "", "HOST:PORT of the node")
	conc := fs.Int("concurrency", 1, "concurrent lockers, each on its own key")
	dur := fs.Float64("duration", 5, "seconds to run")
	lease := fs.Float64("lease", 30, "lease of each acquire, seconds")
	if err := fs.Parse(os.Args[1:]); err != nil {
		os.Exit(2)
	}
	if *addr == "" || *conc < 1 || *dur <= 0 || fs.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "lockservice-bench: usage: --addr HOST:PORT [--concurrency N] [--duration SECONDS]")
		os.Exit(2)
	}
	ctx := context.Background()
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	client, err := lockservice.Dial(dctx, []string{*addr}, lockservice.WithName("bench"))
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, "lockservice-bench:", err)
		os.Exit(1)
	}
	defer client.Close()
	o := lockservice.AcquireOptions{Lease: time.Duration(*lease * float64(time.Second)), Wait: 10 * time.Second}
	var pairs, errs atomic.Int64
	report := func(err error) {
		if errs.Add(1) <= 5 {
			fmt.Fprintln(os.Stderr, "lockservice-bench:", err)
		}
	}
	cpu0 := cpuSeconds()
	start := time.Now()
	stop := start.Add(time.Duration(*dur * float64(time.Second)))
	var wg sync.WaitGroup
	for i := 0; i < *conc; i++ {
		wg.Add(1)
		go func(key string) {
			defer wg.Done()
			for time.Now().Before(stop) {
				l, err := client.Acquire(ctx, key, o)
				if err != nil {
					report(err)
					continue
				}
				if err := l.Release(ctx); err != nil {
					report(err)
					continue
				}
				pairs.Add(1)
			}
		}("bench/" + strconv.Itoa(i))
	}
	wg.Wait()
	elapsed := time.Since(start).Seconds()
	cpu := cpuSeconds() - cpu0
	n := pairs.Load()
	out := map[string]any{
		"client":         "go",
		"version":        lockservice.Version,
		"addr":           *addr,
		"concurrency":    *conc,
		"duration_s":     elapsed,
		"pairs":          n,
		"errors":         errs.Load(),
		"pairs_per_s":    float64(n) / elapsed,
		"cpu_s":          cpu,
		"cpu_s_per_pair": 0.0,
	}
	if n > 0 {
		out["cpu_s_per_pair"] = cpu / float64(n)
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
}
