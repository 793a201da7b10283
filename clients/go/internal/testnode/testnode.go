// Package testnode starts real lockservice nodes (twistd with the
// lockservice plugin, found through LOCKSERVICE_TWISTD) for tests.
package testnode

import (
	"bufio"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Twistd returns the twistd path, or skips the test with one line (fails
// it under CI=true: a skipped test there would pass unseen).
func Twistd(t testing.TB) string {
	t.Helper()
	p := os.Getenv("LOCKSERVICE_TWISTD")
	if p == "" {
		const why = "real-node test: set LOCKSERVICE_TWISTD to a twistd with the lockservice plugin"
		if os.Getenv("CI") == "true" {
			t.Fatal(why)
		}
		t.Skip(why)
	}
	return p
}

// Node is one running node.
type Node struct {
	Addr string
	Args []string
	cmd  *exec.Cmd
	log  string
	t    testing.TB
	done chan struct{}
}

// FreePort returns a free loopback port.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Options of a node.
type Options struct {
	Peers  []string // the cluster's addresses, priority order; nil: lone
	Secret string   // secret file (clusters)
	TLS    []string // extra TLS options (--tls-cert F --tls-key F [--tls-ca F])
	Extra  []string // more options
}

// Start starts a node listening on addr ("127.0.0.1:port").
func Start(t testing.TB, addr string, o Options) *Node {
	t.Helper()
	Twistd(t)
	_, port, _ := net.SplitHostPort(addr)
	args := []string{"-n", "--pidfile=", "lockservice", "--listen", "tcp:" + port + ":interface=127.0.0.1"}
	if o.Peers != nil {
		args = append(args, "--peers", strings.Join(o.Peers, ","), "--node", addr, "--secret", o.Secret)
	}
	args = append(args, o.TLS...)
	args = append(args, o.Extra...)
	n := &Node{Addr: addr, Args: args, t: t}
	n.start()
	t.Cleanup(n.Stop)
	return n
}

func (n *Node) start() {
	dir := n.t.TempDir()
	n.log = filepath.Join(dir, "node.log")
	f, err := os.Create(n.log)
	if err != nil {
		n.t.Fatal(err)
	}
	cmd := exec.Command(Twistd(n.t), n.Args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		n.t.Fatal(err)
	}
	n.cmd = cmd
	n.done = make(chan struct{})
	go func() {
		cmd.Wait()
		f.Close()
		close(n.done)
	}()
}

// Restart starts the stopped node again.
func (n *Node) Restart() { n.start() }

// Kill sends SIGKILL and waits for the process to end.
func (n *Node) Kill() { n.signal(syscall.SIGKILL) }

// Term sends SIGTERM and waits (up to 15 s, then SIGKILL) for the end.
func (n *Node) Term() { n.signal(syscall.SIGTERM) }

func (n *Node) signal(sig syscall.Signal) {
	if n.cmd == nil || n.cmd.Process == nil {
		return
	}
	select {
	case <-n.done:
		return
	default:
	}
	n.cmd.Process.Signal(sig)
	select {
	case <-n.done:
	case <-time.After(15 * time.Second):
		n.cmd.Process.Kill()
		<-n.done
	}
}

// Stop ends the node (SIGTERM, then SIGKILL). A paused node is resumed
// first.
func (n *Node) Stop() {
	n.Resume()
	n.Term()
}

// Pause stops the process (SIGSTOP): its connections stay open, nothing is
// answered.
func (n *Node) Pause() {
	if n.cmd != nil && n.cmd.Process != nil {
		n.cmd.Process.Signal(syscall.SIGSTOP)
	}
}

// Resume continues a paused process (SIGCONT).
func (n *Node) Resume() {
	if n.cmd != nil && n.cmd.Process != nil {
		n.cmd.Process.Signal(syscall.SIGCONT)
	}
}

// Log returns the node's output so far.
func (n *Node) Log() string {
	b, _ := os.ReadFile(n.log)
	return string(b)
}

// WaitPing waits until the node answers "P x" (over TLS when cfg is set).
func (n *Node) WaitPing(cfg *tls.Config) {
	n.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-n.done:
			n.t.Fatalf("node %s exited: %s", n.Addr, n.Log())
		default:
		}
		if Ping(n.Addr, cfg) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	n.t.Fatalf("node %s does not answer P: %s", n.Addr, n.Log())
}

// Ping sends "P x" and reports whether it was echoed within a second.
func Ping(addr string, cfg *tls.Config) bool {
	return Ask(addr, cfg, "P x") == "P x"
}

// Ask sends one line on a new connection and returns the first answer
// line ("" on failure).
func Ask(addr string, cfg *tls.Config, line string) string {
	nc, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return ""
	}
	defer nc.Close()
	if cfg != nil {
		cfg = cfg.Clone()
		if cfg.ServerName == "" {
			cfg.ServerName, _, _ = net.SplitHostPort(addr)
		}
		nc = tls.Client(nc, cfg)
	}
	nc.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := nc.Write([]byte(line + "\n")); err != nil {
		return ""
	}
	s, err := bufio.NewReader(nc).ReadString('\n')
	if err != nil {
		return ""
	}
	return strings.TrimRight(s, "\r\n")
}

// Lone starts a lone node on a free port and waits until it answers.
func Lone(t testing.TB, o Options, cfg *tls.Config) *Node {
	t.Helper()
	n := Start(t, "127.0.0.1:"+strconv.Itoa(FreePort(t)), o)
	n.WaitPing(cfg)
	return n
}

// Cluster starts size nodes (node 0 highest priority) and waits until they
// answer and node 0 serves.
func Cluster(t testing.TB, size int) []*Node {
	t.Helper()
	secret := filepath.Join(t.TempDir(), "secret")
	b := make([]byte, 24)
	rand.Read(b)
	if err := os.WriteFile(secret, []byte(hex.EncodeToString(b)), 0o600); err != nil {
		t.Fatal(err)
	}
	peers := make([]string, size)
	for i := range peers {
		peers[i] = "127.0.0.1:" + strconv.Itoa(FreePort(t))
	}
	nodes := make([]*Node, size)
	for i := range nodes {
		nodes[i] = Start(t, peers[i], Options{Peers: peers, Secret: secret})
	}
	for _, n := range nodes {
		n.WaitPing(nil)
	}
	// Node 0 is active once a standby redirects to it.
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if Ask(peers[size-1], nil, "R probe 0") == "M R probe "+peers[0] &&
			Ask(peers[0], nil, "R probe 0") == "R probe STALE" {
			return nodes
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("cluster did not settle: %s", nodes[0].Log())
	return nil
}
