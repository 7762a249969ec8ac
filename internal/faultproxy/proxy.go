// Package faultproxy is a TCP proxy for tests that hurts the link it carries, at run time: it adds
// latency, blackholes one or both directions, resets every connection, or refuses new ones.
//
// It listens on 127.0.0.1 only and forwards only to a loopback address. Each connection costs four
// goroutines (a reader and a writer per direction); Close stops all of them.
package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Direction selects the directions of a connection that a fault applies to.
type Direction int

const (
	// Upstream is the direction from the client to the server.
	Upstream Direction = 1 << iota
	// Downstream is the direction from the server to the client.
	Downstream
	// Both is Upstream and Downstream.
	Both = Upstream | Downstream
)

func (d Direction) String() string {
	switch d {
	case Upstream:
		return "upstream"
	case Downstream:
		return "downstream"
	case Both:
		return "both"
	}
	return fmt.Sprintf("Direction(%d)", int(d))
}

// dirs lists the directions in d, as indices into the per-direction state.
func (d Direction) dirs() ([]int, error) {
	switch d {
	case Upstream:
		return []int{up}, nil
	case Downstream:
		return []int{down}, nil
	case Both:
		return []int{up, down}, nil
	}
	return nil, fmt.Errorf("faultproxy: dir: %v is not Upstream, Downstream or Both", d)
}

// Indices of the per-direction state.
const (
	up   = 0
	down = 1
)

// dialTimeout bounds the connection to the target for one accepted client.
const dialTimeout = 5 * time.Second

// chunkQueue is how many chunks a direction holds between its reader and its writer. With 32 KiB
// reads it bounds the data in flight per direction to 1 MiB; then the reader stops reading and TCP
// flow control slows the sender, as a real link would.
const chunkQueue = 32

// readSize is the buffer size of one read.
const readSize = 32 << 10

// Proxy forwards TCP connections from its address to a target and injects faults. Its methods are
// safe for concurrent use.
type Proxy struct {
	target string
	listen func() (net.Listener, error) // listens on the proxy's address
	dial   func(ctx context.Context) (net.Conn, error)

	accepted atomic.Int64

	ctx    context.Context // cancelled by Close: ends dials and waits
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine of the proxy

	// mu guards the fields below. Goroutines read the fault state under mu; a change closes
	// changed and replaces it, so that waiters wake up and read it again.
	mu        sync.Mutex
	addr      string
	ln        net.Listener // nil while refusing or closed
	latency   [2]time.Duration
	blackhole [2]bool
	changed   chan struct{}
	links     map[*link]struct{}
	closed    bool
}

// New starts a proxy on a free port of 127.0.0.1 that forwards to target, a host:port whose host
// is a loopback address or localhost. Close stops it.
func New(target string) (*Proxy, error) {
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: target %q: %w", target, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return nil, fmt.Errorf("faultproxy: target %q is not a loopback address", target)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen: %w", err)
	}
	addr := ln.Addr().String()
	var d net.Dialer
	return start(target, ln,
		func() (net.Listener, error) { return net.Listen("tcp", addr) },
		func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "tcp", target) },
	), nil
}

// start runs a proxy on ln. listen makes a new listener on the same address after refusing;
// dial connects to the target. Tests use it with in-memory connections.
func start(target string, ln net.Listener, listen func() (net.Listener, error), dial func(context.Context) (net.Conn, error)) *Proxy {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		target:  target,
		listen:  listen,
		dial:    dial,
		ctx:     ctx,
		cancel:  cancel,
		addr:    ln.Addr().String(),
		ln:      ln,
		changed: make(chan struct{}),
		links:   make(map[*link]struct{}),
	}
	p.wg.Add(1)
	go p.acceptLoop(ln)
	return p
}

// Addr is the proxy's host:port. It stays the same while the proxy refuses connections.
func (p *Proxy) Addr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

// Target is the host:port the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Accepted counts the client connections the proxy has accepted since it started, refused ones
// excluded.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// Open is the number of connections the proxy carries now.
func (p *Proxy) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// SetLatency delays every chunk of data in the directions dir by d, counted from the moment the
// proxy read it, as a link with that one-way delay would: chunks in flight overlap, so latency does
// not cut throughput. 1 ms on Both adds 2 ms to a round trip. 0 removes the delay. It applies to
// data not yet written, on current and future connections.
func (p *Proxy) SetLatency(dir Direction, d time.Duration) error {
	ds, err := dir.dirs()
	if err != nil {
		return err
	}
	if d < 0 {
		return fmt.Errorf("faultproxy: latency: %v is negative", d)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, i := range ds {
		p.latency[i] = d
	}
	p.notifyLocked()
	return nil
}

// SetBlackhole stops (on) or resumes (off) forwarding in the directions dir, on current and future
// connections. A blackholed direction neither reads nor writes, and its sockets stay open: the
// sender's data piles up in kernel buffers until the sender blocks, and the receiver sees silence.
// Nothing is dropped: when the blackhole ends, the held data is delivered in order, as after a
// healed network partition. A client that closes meanwhile is noticed only then.
func (p *Proxy) SetBlackhole(dir Direction, on bool) error {
	ds, err := dir.dirs()
	if err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, i := range ds {
		p.blackhole[i] = on
	}
	p.notifyLocked()
	return nil
}

// SetRefuse makes new connections fail (on) or succeed again (off). Refusing closes the listening
// socket, so clients get "connection refused"; current connections go on. Turning it off listens
// on the same address again, which fails if another process took the port meanwhile.
func (p *Proxy) SetRefuse(on bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("faultproxy: closed")
	}
	switch {
	case on && p.ln != nil:
		err := p.ln.Close()
		p.ln = nil
		if err != nil {
			return fmt.Errorf("faultproxy: refuse: %w", err)
		}
	case !on && p.ln == nil:
		ln, err := p.listen()
		if err != nil {
			return fmt.Errorf("faultproxy: listen again on %s: %w", p.addr, err)
		}
		p.ln = ln
		p.wg.Add(1)
		go p.acceptLoop(ln)
	}
	return nil
}

// Reset closes every current connection with a TCP RST on both sides (SO_LINGER 0), as a crashed
// middlebox would, and returns how many it closed. New connections are accepted as before.
func (p *Proxy) Reset() int {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.abort()
	}
	return len(links)
}

// Normal removes every fault: no latency, no blackhole, new connections accepted. Its error is
// SetRefuse's.
func (p *Proxy) Normal() error {
	p.mu.Lock()
	p.latency = [2]time.Duration{}
	p.blackhole = [2]bool{}
	p.notifyLocked()
	p.mu.Unlock()
	return p.SetRefuse(false)
}

// Close stops accepting, closes every connection and waits for the proxy's goroutines to end. It
// is safe to call more than once.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	var err error
	if p.ln != nil {
		err = p.ln.Close()
		p.ln = nil
	}
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	p.cancel()
	for _, l := range links {
		l.close()
	}
	p.wg.Wait()
	return err
}

// notifyLocked wakes every goroutine that waits for a change of the fault state. Caller must
// hold mu.
func (p *Proxy) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Proxy) acceptLoop(ln net.Listener) {
	defer p.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors or the like: wait a little and try again, as net/http
			// does. Close or SetRefuse(true) closes ln and ends the loop.
			select {
			case <-time.After(5 * time.Millisecond):
				continue
			case <-p.ctx.Done():
				return
			}
		}
		p.accepted.Add(1)
		p.wg.Add(1)
		go p.connect(c)
	}
}

// connect dials the target for the client c and starts forwarding. If the target cannot be
// reached, the client gets a reset, as from a server that is down.
func (p *Proxy) connect(c net.Conn) {
	defer p.wg.Done()
	ctx, cancel := context.WithTimeout(p.ctx, dialTimeout)
	s, err := p.dial(ctx)
	cancel()
	if err != nil {
		abortConn(c)
		return
	}
	l := &link{p: p, client: c, server: s, done: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		l.close()
		return
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()
	l.halves.Store(2)
	p.wg.Add(4)
	l.forward(up, c, s)
	l.forward(down, s, c)
}

// faults returns the latency of direction i and, if the direction is blackholed, a channel that is
// closed when the fault state changes (nil if it is not blackholed).
func (p *Proxy) faults(i int) (time.Duration, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.blackhole[i] {
		return p.latency[i], p.changed
	}
	return p.latency[i], nil
}

// waitOpen blocks while direction i is blackholed. It returns false if done is closed first.
func (p *Proxy) waitOpen(i int, done <-chan struct{}) bool {
	for {
		_, changed := p.faults(i)
		if changed == nil {
			return true
		}
		select {
		case <-changed:
		case <-done:
			return false
		}
	}
}
