package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/lockservice/lockservice/clients/go/internal/fakeserver"
	"github.com/lockservice/lockservice/clients/go/internal/testcerts"
	"github.com/lockservice/lockservice/clients/go/internal/testnode"
)

var driverBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "lockservice-driver-test")
	if err != nil {
		panic(err)
	}
	driverBin = filepath.Join(dir, "lockservice-driver")
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out, err := exec.Command(goTool, "build", "-o", driverBin, ".").CombinedOutput()
	if err != nil {
		os.Stderr.Write(out)
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

const bound = 15 * time.Second

// proc is a running driver.
type proc struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan map[string]any
	raw   chan string
	done  chan error
}

func startDriver(t *testing.T, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(driverBin, args...)
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, stdin: stdin, lines: make(chan map[string]any, 100),
		raw: make(chan string, 100), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var m map[string]any
			dec := json.NewDecoder(strings.NewReader(sc.Text()))
			dec.UseNumber()
			if err := dec.Decode(&m); err != nil {
				t.Errorf("driver wrote a non-JSON line: %q", sc.Text())
				continue
			}
			p.raw <- sc.Text()
			p.lines <- m
		}
		close(p.lines)
		p.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		stdin.Close()
		select {
		case <-p.done:
		case <-time.After(bound):
			cmd.Process.Kill()
		}
	})
	return p
}

func (p *proc) send(line string) {
	p.t.Helper()
	if _, err := io.WriteString(p.stdin, line+"\n"); err != nil {
		p.t.Fatal(err)
	}
}

func (p *proc) next() map[string]any {
	p.t.Helper()
	select {
	case m, ok := <-p.lines:
		if !ok {
			p.t.Fatal("driver closed its output")
		}
		<-p.raw
		return m
	case <-time.After(bound):
		p.t.Fatal("no output from the driver")
	}
	return nil
}

// result waits for the result of id (events and other results are kept in
// order in the returned slice of skipped lines).
func (p *proc) result(id any) (map[string]any, []map[string]any) {
	p.t.Helper()
	var skipped []map[string]any
	for {
		m := p.next()
		if sameID(m["id"], id) {
			return m, skipped
		}
		skipped = append(skipped, m)
	}
}

func sameID(got, want any) bool {
	if n, ok := got.(json.Number); ok {
		if w, ok := want.(int); ok {
			return n.String() == jsonNum(w)
		}
		return false
	}
	return got == want
}

func jsonNum(i int) string { b, _ := json.Marshal(i); return string(b) }

func startFake(t *testing.T) *fakeserver.Server {
	s, err := fakeserver.Start(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func TestBadArguments(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--addrs"},
		{"--addrs", "nohostport"},
		{"--addrs", "127.0.0.1:1", "extra"},
		{"--addrs", "127.0.0.1:1", "--bogus"},
		{"--addrs", "127.0.0.1:1", "--tls-cert", "x"},
		{"--addrs", "127.0.0.1:1", "--tls-ca", "/nonexistent"},
		{"--addrs", "127.0.0.1:1", "--name", "a b"},
	} {
		cmd := exec.Command(driverBin, args...)
		var stderr, stdout bytes.Buffer
		cmd.Stderr, cmd.Stdout = &stderr, &stdout
		cmd.Stdin = strings.NewReader("")
		err := cmd.Run()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 2 {
			t.Errorf("%q: want exit 2, got %v", args, err)
		}
		if lines := strings.Split(strings.TrimRight(stderr.String(), "\n"), "\n"); len(lines) != 1 || lines[0] == "" {
			t.Errorf("%q: want one stderr line, got %q", args, stderr.String())
		}
		if stdout.Len() != 0 {
			t.Errorf("%q: stdout %q", args, stdout.String())
		}
	}
}

func TestAcquireReleaseRenewOnTheWire(t *testing.T) {
	s := startFake(t)
	p := startDriver(t, "--addrs", s.Addr, "--name", "drv")
	p.send(`{"id":1,"op":"acquire","key":"k","lease":30,"wait":5,"share":null,"keepalive":false}`)
	r, _ := p.result(1)
	tok, ok := r["token"].(string)
	if r["ok"] != true || !ok || tok == "" {
		t.Fatalf("acquire: %v", r)
	}
	if got := s.Texts("A "); len(got) != 1 || got[0] != "A k 30 5" {
		t.Fatalf("A lines %q", got)
	}
	p.send(`{"id":"two","op":"renew","key":"k","token":"` + tok + `","lease":12.5}`)
	if r, _ := p.result("two"); r["ok"] != true {
		t.Fatalf("renew: %v", r)
	}
	if got := s.Texts("N "); got[0] != "N k "+tok+" 12.5" {
		t.Fatalf("N lines %q", got)
	}
	p.send(`{"id":3,"op":"acquire","key":"s","lease":2.0015,"wait":0.25,"share":3}`)
	if r, _ := p.result(3); r["ok"] != true {
		t.Fatalf("acquire: %v", r)
	}
	p.send(`{"id":4,"op":"acquire","key":"r","lease":100000,"wait":0,"share":"r","keepalive":true}`)
	if r, _ := p.result(4); r["ok"] != true {
		t.Fatalf("acquire: %v", r)
	}
	got := s.Texts("A ")
	if got[1] != "A s 2.0015 0.25 3" || got[2] != "A r 100000 0 r" {
		t.Fatalf("A lines %q", got)
	}
	p.send(`{"id":5,"op":"release","key":"k","token":"` + tok + `"}`)
	if r, _ := p.result(5); r["ok"] != true {
		t.Fatalf("release: %v", r)
	}
	p.send(`{"id":6,"op":"release","key":"k","token":"` + tok + `"}`)
	if r, _ := p.result(6); r["error"] != "stale" {
		t.Fatalf("second release: %v", r)
	}
	p.send(`{"id":7,"op":"renew","key":"k","token":"` + tok + `","lease":5}`)
	if r, _ := p.result(7); r["error"] != "stale" {
		t.Fatalf("stale renew: %v", r)
	}
	p.send(`{"id":9,"op":"acquire","key":"tiny","lease":0.0000001,"wait":1e-7}`)
	p.result(9)
	if got := s.Texts("A tiny"); got[0] != "A tiny 0.000001 0.000001" {
		t.Fatalf("A lines %q", got)
	}
	// A share that does not match the key: rejected.
	p.send(`{"id":8,"op":"acquire","key":"s","lease":1,"wait":1,"share":4}`)
	if r, _ := p.result(8); r["error"] != "rejected" {
		t.Fatalf("mismatch: %v", r)
	}
}

func TestInvalidAndBadCommands(t *testing.T) {
	s := startFake(t)
	p := startDriver(t, "--addrs", s.Addr)
	cases := []struct {
		line string
		id   any
		want string
	}{
		{`{"id":1,"op":"acquire","key":"a b","lease":30,"wait":5}`, 1, "invalid"},
		{`{"id":2,"op":"acquire","key":"k","lease":0,"wait":5}`, 2, "invalid"},
		{`{"id":3,"op":"acquire","key":"k","lease":-1,"wait":5}`, 3, "invalid"},
		{`{"id":4,"op":"acquire","key":"k","lease":1,"wait":-1}`, 4, "invalid"},
		{`{"id":5,"op":"acquire","key":"k","lease":1,"wait":1,"share":0}`, 5, "invalid"},
		{`{"id":6,"op":"acquire","key":"k","lease":1,"wait":1,"share":"w"}`, 6, "invalid"},
		{`{"id":7,"op":"acquire","key":"k","lease":1,"wait":1,"share":65536}`, 7, "invalid"},
		{`{"id":8,"op":"acquire","key":"k","lease":1}`, 8, "bad_command"},
		{`{"id":9,"op":"fly"}`, 9, "bad_command"},
		{`{"id":10,"op":"release","key":"k","token":"12x"}`, 10, "invalid"},
		{`{"id":11,"op":"release","key":"k"}`, 11, "bad_command"},
		{`{"id":12,"op":"campaign","election":"e","value":"","lease":5}`, 12, "invalid"},
		{`{"id":13,"op":"campaign","election":"e","value":"a b","lease":5}`, 13, "invalid"},
		{`{"id":14,"op":"observe","key":"k","token":"0"}`, 14, "bad_command"},
		{`{"id":15,"op":"acquire","key":"` + strings.Repeat("x", 251) + `","lease":1,"wait":1}`, 15, "invalid"},
		{`{"id":16,"op":"cancel","target":999}`, 16, "unknown_target"},
		{`{"id":"s","op":"cancel","target":"nope"}`, "s", "unknown_target"},
		// A field of the wrong type is a bad command.
		{`{"id":17,"op":"cancel","target":true}`, 17, "bad_command"},
		{`{"id":18,"op":"cancel","target":1.5}`, 18, "bad_command"},
		{`{"id":19,"op":"cancel","target":[1]}`, 19, "bad_command"},
		{`{"id":20,"op":"cancel","target":{"id":1}}`, 20, "bad_command"},
		{`{"id":21,"op":"acquire","key":"k","lease":"30","wait":5}`, 21, "bad_command"},
		{`{"id":22,"op":"acquire","key":"k","lease":30,"wait":"5"}`, 22, "bad_command"},
		{`{"id":23,"op":"acquire","key":"k","lease":1e400,"wait":5}`, 23, "invalid"},
		{`{"id":24,"op":"renew","key":"k","token":"1","lease":-1e21}`, 24, "invalid"},
	}
	for _, c := range cases {
		p.send(c.line)
		r, _ := p.result(c.id)
		if r["ok"] != false || r["error"] != c.want {
			t.Errorf("%s: got %v, want %s", c.line, r, c.want)
		}
	}
	p.send(`{nope`)
	if r := p.next(); r["id"] != nil || r["error"] != "bad_command" {
		t.Fatalf("bad JSON: %v", r)
	}
	// An id is an integer or a string.
	for _, line := range []string{`{"id":1.5,"op":"leader","election":"e"}`, `{"id":true,"op":"leader","election":"e"}`,
		`{"id":null,"op":"leader","election":"e"}`, `{"op":"leader","election":"e"}`} {
		p.send(line)
		if r := p.next(); r["id"] != nil || r["error"] != "bad_command" {
			t.Fatalf("%s: %v", line, r)
		}
	}
	if n := len(s.Texts("A ")); n != 0 {
		t.Fatalf("refused commands were sent: %q", s.Texts("A "))
	}
	// The driver goes on.
	p.send(`{"id":99,"op":"acquire","key":"k","lease":1,"wait":1}`)
	if r, _ := p.result(99); r["ok"] != true {
		t.Fatalf("after errors: %v", r)
	}
}

func TestCancelOrderingAndWithdraw(t *testing.T) {
	s := startFake(t)
	s.Grant("k", "other#1", 60)
	p := startDriver(t, "--addrs", s.Addr)
	p.send(`{"id":1,"op":"acquire","key":"k","lease":30,"wait":0}`)
	if _, ok := s.WaitLine(bound, "A k"); !ok {
		t.Fatal("no A")
	}
	p.send(`{"id":2,"op":"cancel","target":1}`)
	first := p.next()
	second := p.next()
	if !sameID(first["id"], 1) || first["error"] != "cancelled" {
		t.Fatalf("first line %v", first)
	}
	if !sameID(second["id"], 2) || second["ok"] != true {
		t.Fatalf("second line %v", second)
	}
	if _, ok := s.WaitLine(bound, "C k"); !ok {
		t.Fatalf("no C k: %q", s.Texts(""))
	}
	if s.Waiting("k") != 0 {
		t.Fatal("waiter left")
	}
	// A finished target.
	p.send(`{"id":3,"op":"cancel","target":1}`)
	if r, _ := p.result(3); r["error"] != "unknown_target" {
		t.Fatalf("finished target: %v", r)
	}
	// Observe can be cancelled too.
	p.send(`{"id":"o","op":"observe","key":"free","token":"0","wait":0}`)
	if _, ok := s.WaitLine(bound, "O free"); !ok {
		t.Fatal("no O")
	}
	p.send(`{"id":4,"op":"cancel","target":"o"}`)
	first, second = p.next(), p.next()
	if first["id"] != "o" || first["error"] != "cancelled" || !sameID(second["id"], 4) || second["ok"] != true {
		t.Fatalf("observe cancel: %v then %v", first, second)
	}
}

func TestObserveLeaderCampaign(t *testing.T) {
	s := startFake(t)
	p := startDriver(t, "--addrs", s.Addr, "--name", "drv")
	p.send(`{"id":1,"op":"observe","key":"k","token":"0","wait":0.2}`)
	r, _ := p.result(1)
	if r["error"] != "timeout" {
		t.Fatalf("observe: %v", r)
	}
	p.send(`{"id":2,"op":"observe","key":"k","token":"?","wait":0}`)
	r, _ = p.result(2)
	if r["ok"] != true || r["token"] != "0" || r["holder"] != nil {
		t.Fatalf("observe ?: %v", r)
	}
	p.send(`{"id":3,"op":"leader","election":"e"}`)
	r, _ = p.result(3)
	if r["ok"] != true || r["value"] != nil || r["token"] != "0" {
		t.Fatalf("leader: %v", r)
	}
	p.send(`{"id":4,"op":"campaign","election":"e","value":"10.0.0.1:80","lease":10}`)
	r, _ = p.result(4)
	tok := r["token"]
	if r["ok"] != true || tok == nil {
		t.Fatalf("campaign: %v", r)
	}
	p.send(`{"id":5,"op":"leader","election":"e"}`)
	r, _ = p.result(5)
	if r["ok"] != true || r["value"] != "10.0.0.1:80" || r["token"] != tok {
		t.Fatalf("leader: %v", r)
	}
	p.send(`{"id":6,"op":"observe","key":"e","token":"0","wait":5}`)
	r, _ = p.result(6)
	if r["ok"] != true || r["token"] != tok || !strings.HasPrefix(r["holder"].(string), "10.0.0.1:80#") {
		t.Fatalf("observe: %v", r)
	}
	p.send(`{"id":7,"op":"resign","election":"e"}`)
	if r, _ = p.result(7); r["ok"] != true {
		t.Fatalf("resign: %v", r)
	}
	if len(s.Held("e")) != 0 {
		t.Fatal("still leading")
	}
}

func TestLostEvent(t *testing.T) {
	s := startFake(t)
	p := startDriver(t, "--addrs", s.Addr)
	p.send(`{"id":1,"op":"acquire","key":"k","lease":0.6,"wait":1,"keepalive":true}`)
	r, _ := p.result(1)
	tok := r["token"].(string)
	p.send(`{"id":2,"op":"campaign","election":"e","value":"v","lease":0.6}`)
	r, _ = p.result(2)
	etok := r["token"].(string)
	// The node forgets both grants: the renewals are refused.
	for _, kt := range [][2]string{{"k", tok}, {"e", etok}} {
		var n uint64
		json.Unmarshal([]byte(kt[1]), &n)
		s.Expire(kt[0], n)
	}
	seen := map[string]string{}
	for len(seen) < 2 {
		m := p.next()
		if m["event"] != "lost" {
			t.Fatalf("unexpected %v", m)
		}
		seen[m["key"].(string)] = m["token"].(string)
	}
	if seen["k"] != tok || seen["e"] != etok {
		t.Fatalf("lost events %v", seen)
	}
}

func TestCloseCancelsAndReleases(t *testing.T) {
	for _, viaEOF := range []bool{false, true} {
		s := startFake(t)
		s.Grant("busy", "other#1", 60)
		p := startDriver(t, "--addrs", s.Addr)
		p.send(`{"id":1,"op":"acquire","key":"mine","lease":30,"wait":5}`)
		r, _ := p.result(1)
		tok := r["token"].(string)
		p.send(`{"id":2,"op":"acquire","key":"busy","lease":30,"wait":0}`)
		if _, ok := s.WaitLine(bound, "A busy"); !ok {
			t.Fatal("no A busy")
		}
		if viaEOF {
			p.stdin.Close()
		} else {
			p.send(`{"id":3,"op":"close"}`)
		}
		var got []map[string]any
		for m := range p.lines {
			<-p.raw
			got = append(got, m)
		}
		if err := <-p.done; err != nil {
			t.Fatalf("exit: %v", err)
		}
		p.done <- nil
		want := 2
		if viaEOF {
			want = 1
		}
		if len(got) != want || !sameID(got[0]["id"], 2) || got[0]["error"] != "cancelled" {
			t.Fatalf("eof=%v: output %v", viaEOF, got)
		}
		if !viaEOF && (!sameID(got[1]["id"], 3) || got[1]["ok"] != true) {
			t.Fatalf("close answer %v", got[1])
		}
		if rs := s.Texts("R mine "); len(rs) != 1 || rs[0] != "R mine "+tok {
			t.Fatalf("held lock not released: %q", s.Texts(""))
		}
	}
}

// Seconds beyond a Duration go on the wire as given; the node's E answer
// is the result.
func TestHugeSecondsReachTheNode(t *testing.T) {
	s := startFake(t)
	s.SetHook(func(cn *fakeserver.Conn, line string) bool {
		f := strings.Split(line, " ")
		if (f[0] == "A" || f[0] == "N") && len(f) >= 4 && (len(f[2]) > 8 || len(f[3]) > 8) {
			cn.Write("E " + f[0] + " " + f[1] + " beyond the maximum")
			return true
		}
		return false
	})
	p := startDriver(t, "--addrs", s.Addr)
	p.send(`{"id":1,"op":"acquire","key":"a","lease":1e21,"wait":1}`)
	p.send(`{"id":2,"op":"acquire","key":"b","lease":30,"wait":1e21}`)
	p.send(`{"id":3,"op":"acquire","key":"c","lease":10000000000.25,"wait":2.5e-7}`)
	p.send(`{"id":4,"op":"campaign","election":"e","value":"v","lease":1E+21}`)
	start := time.Now()
	for i := 0; i < 4; i++ {
		if r := p.next(); r["error"] != "rejected" {
			t.Fatalf("%v", r)
		}
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("rejected after %v", took)
	}
	want := map[string]string{
		"A a ": "A a 1000000000000000000000 1",
		"A b ": "A b 30 1000000000000000000000",
		"A c ": "A c 10000000000.25 0.000001",
		"A e ": "A e 1000000000000000000000 0",
	}
	for prefix, line := range want {
		if got := s.Texts(prefix); len(got) != 1 || got[0] != line {
			t.Errorf("%q lines %q, want %q", prefix, got, line)
		}
	}
	p.send(`{"id":5,"op":"acquire","key":"k","lease":30,"wait":1}`)
	r, _ := p.result(5)
	p.send(`{"id":6,"op":"renew","key":"k","token":"` + r["token"].(string) + `","lease":1e21}`)
	if r, _ := p.result(6); r["error"] != "rejected" {
		t.Fatalf("renew: %v", r)
	}
	if got := s.Texts("N k "); len(got) != 1 || !strings.HasSuffix(got[0], " 1000000000000000000000") {
		t.Fatalf("N lines %q", got)
	}
}

// close on a node that stopped answering: the withdrawal of a pending
// acquire and the release of a held lock run at once, within one 5 s
// deadline.
func TestCloseOnAStalledNodeWithinFiveSeconds(t *testing.T) {
	s := startFake(t)
	s.Grant("busy", "other#1", 60)
	p := startDriver(t, "--addrs", s.Addr)
	p.send(`{"id":1,"op":"acquire","key":"mine","lease":60,"wait":5}`)
	if r, _ := p.result(1); r["ok"] != true {
		t.Fatalf("acquire: %v", r)
	}
	p.send(`{"id":2,"op":"acquire","key":"busy","lease":30,"wait":0}`)
	if _, ok := s.WaitLine(bound, "A busy"); !ok {
		t.Fatal("no A busy")
	}
	s.SetStall(true)
	start := time.Now()
	p.send(`{"id":3,"op":"close"}`)
	r, skipped := p.result(3)
	took := time.Since(start)
	if r["ok"] != true || took > 5500*time.Millisecond || took < 4*time.Second {
		t.Fatalf("close: %v after %v", r, took)
	}
	if len(skipped) != 1 || !sameID(skipped[0]["id"], 2) || skipped[0]["error"] != "cancelled" {
		t.Fatalf("before the close's answer: %v", skipped)
	}
	if len(s.Texts("C busy")) != 1 || len(s.Texts("R mine ")) == 0 {
		t.Fatalf("lines %q", s.Texts(""))
	}
}

func TestConcurrentCommands(t *testing.T) {
	s := startFake(t)
	s.Grant("slow", "other#1", 60)
	p := startDriver(t, "--addrs", s.Addr)
	p.send(`{"id":1,"op":"acquire","key":"slow","lease":30,"wait":1}`)
	p.send(`{"id":2,"op":"acquire","key":"fast","lease":30,"wait":1}`)
	first := p.next()
	if !sameID(first["id"], 2) {
		t.Fatalf("a command waited for an earlier one: %v", first)
	}
	if r := p.next(); !sameID(r["id"], 1) || r["error"] != "timeout" {
		t.Fatalf("slow: %v", r)
	}
}

func TestDriverTLSFlags(t *testing.T) {
	certs, err := testcerts.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s, err := fakeserver.Start(certs.ServerConfig(true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	p := startDriver(t, "--addrs", s.Addr, "--tls-ca", certs.CAFile, "--tls-cert", certs.ClientCert, "--tls-key", certs.ClientKey)
	p.send(`{"id":1,"op":"acquire","key":"k","lease":5,"wait":1}`)
	if r, _ := p.result(1); r["ok"] != true {
		t.Fatalf("acquire over mutual TLS: %v", r)
	}
	// Without the client certificate the node refuses the connection.
	q := startDriver(t, "--addrs", s.Addr, "--tls-ca", certs.CAFile)
	q.send(`{"id":1,"op":"acquire","key":"k2","lease":5,"wait":1}`)
	if r, _ := q.result(1); r["error"] != "no_connection" {
		t.Fatalf("acquire without a client certificate: %v", r)
	}
}

func TestDriverRealNode(t *testing.T) {
	n := testnode.Lone(t, testnode.Options{}, nil)
	p := startDriver(t, "--addrs", n.Addr, "--name", "drv")
	q := startDriver(t, "--addrs", n.Addr, "--name", "other")
	p.send(`{"id":1,"op":"acquire","key":"k","lease":30,"wait":5}`)
	r, _ := p.result(1)
	tok, _ := r["token"].(string)
	if r["ok"] != true || tok == "" {
		t.Fatalf("acquire: %v", r)
	}
	q.send(`{"id":1,"op":"observe","key":"k","token":"0","wait":5}`)
	if r, _ := q.result(1); r["ok"] != true || r["token"] != tok || !strings.HasPrefix(r["holder"].(string), "drv#") {
		t.Fatalf("observe (O): %v", r)
	}
	// A queued acquire, cancelled: withdrawn (C), so after the release
	// the key is free for a third party at once.
	q.send(`{"id":2,"op":"acquire","key":"k","lease":30,"wait":0}`)
	time.Sleep(200 * time.Millisecond)
	q.send(`{"id":3,"op":"cancel","target":2}`)
	first, second := q.next(), q.next()
	if !sameID(first["id"], 2) || first["error"] != "cancelled" || !sameID(second["id"], 3) || second["ok"] != true {
		t.Fatalf("cancel: %v then %v", first, second)
	}
	p.send(`{"id":2,"op":"release","key":"k","token":"` + tok + `"}`)
	if r, _ := p.result(2); r["ok"] != true {
		t.Fatalf("release: %v", r)
	}
	p.send(`{"id":3,"op":"acquire","key":"k","lease":30,"wait":2}`)
	if r, _ := p.result(3); r["ok"] != true {
		t.Fatalf("key not free after the withdrawal (C): %v", r)
	}
	p.send(`{"id":4,"op":"campaign","election":"e","value":"alpha","lease":5}`)
	r, _ = p.result(4)
	etok := r["token"]
	q.send(`{"id":4,"op":"leader","election":"e"}`)
	if r, _ := q.result(4); r["value"] != "alpha" || r["token"] != etok {
		t.Fatalf("leader: %v", r)
	}
	p.send(`{"id":5,"op":"close"}`)
	if r, _ := p.result(5); r["ok"] != true {
		t.Fatalf("close: %v", r)
	}
	q.send(`{"id":5,"op":"leader","election":"e"}`)
	if r, _ := q.result(5); r["value"] != nil || r["token"] != "0" {
		t.Fatalf("leader after close: %v", r)
	}
}
