package faultproxy

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// memListener is an in-memory listener for tests inside a synctest bubble: connect makes a
// net.Pipe and hands one end to Accept.
type memListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newMemListener() *memListener {
	return &memListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (l *memListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *memListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *memListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }

func (l *memListener) connect(t *testing.T) net.Conn {
	t.Helper()
	c, s := net.Pipe()
	select {
	case l.conns <- s:
	case <-l.done:
		t.Fatal("listener closed")
	}
	return c
}

// memEcho is an in-memory server behind the proxy: each connection echoes what it reads and
// records it in got.
type memEcho struct {
	got   chan string
	conns chan net.Conn
}

func (e *memEcho) dial(ctx context.Context) (net.Conn, error) {
	c, s := net.Pipe()
	e.conns <- s
	go func() {
		buf := make([]byte, 1024)
		for {
			n, err := s.Read(buf)
			if err != nil {
				s.Close()
				return
			}
			e.got <- string(buf[:n])
			if _, err := s.Write(buf[:n]); err != nil {
				s.Close()
				return
			}
		}
	}()
	return c, nil
}

// startMem starts a proxy on in-memory connections, in the current synctest bubble.
func startMem(t *testing.T) (*Proxy, *memListener, *memEcho) {
	ln := newMemListener()
	echo := &memEcho{got: make(chan string, 100), conns: make(chan net.Conn, 100)}
	p := start("echo", ln, func() (net.Listener, error) { return nil, errors.New("no") }, echo.dial)
	t.Cleanup(func() { require.NoError(t, p.Close()) })
	return p, ln, echo
}

func roundTrip(t *testing.T, c net.Conn, msg string) {
	t.Helper()
	_, err := c.Write([]byte(msg))
	require.NoError(t, err)
	buf := make([]byte, len(msg))
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	require.Equal(t, msg, string(buf))
}

func TestLatencyAddsToRoundTrip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, ln, _ := startMem(t)
		c := ln.connect(t)
		defer c.Close()

		start := time.Now()
		roundTrip(t, c, "a")
		assert.Zero(t, time.Since(start), "no latency set")

		require.NoError(t, p.SetLatency(Both, time.Millisecond))
		start = time.Now()
		roundTrip(t, c, "b")
		assert.Equal(t, 2*time.Millisecond, time.Since(start), "1 ms each way")

		// Per direction, changed at run time.
		require.NoError(t, p.SetLatency(Upstream, 5*time.Millisecond))
		require.NoError(t, p.SetLatency(Downstream, 0))
		start = time.Now()
		roundTrip(t, c, "c")
		assert.Equal(t, 5*time.Millisecond, time.Since(start))
	})
}

// Chunks in flight overlap: three messages sent back to back over a 10 ms link all arrive after
// 10 ms, not one after another.
func TestLatencyIsPipelined(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, ln, echo := startMem(t)
		require.NoError(t, p.SetLatency(Upstream, 10*time.Millisecond))
		c := ln.connect(t)
		defer c.Close()
		go func() {
			buf := make([]byte, 10)
			for {
				if _, err := c.Read(buf); err != nil {
					return
				}
			}
		}()
		start := time.Now()
		for _, m := range []string{"x", "y", "z"} {
			_, err := c.Write([]byte(m))
			require.NoError(t, err)
		}
		for _, want := range []string{"x", "y", "z"} {
			assert.Equal(t, want, <-echo.got)
		}
		assert.Equal(t, 10*time.Millisecond, time.Since(start))
	})
}

func TestBlackholeHoldsAndDelivers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, ln, echo := startMem(t)
		c := ln.connect(t)
		defer c.Close()
		roundTrip(t, c, "warm")
		<-echo.got

		require.NoError(t, p.SetBlackhole(Upstream, true))
		var wrote sync.WaitGroup
		wrote.Add(1)
		secondWritten := make(chan struct{})
		go func() {
			defer wrote.Done()
			_, _ = c.Write([]byte("1")) // read by the reader already waiting in Read, then held
			_, _ = c.Write([]byte("2")) // not read: the reader stops reading
			close(secondWritten)
		}()
		time.Sleep(time.Hour)
		synctest.Wait()
		assert.Empty(t, echo.got, "data crossed an upstream blackhole")
		select {
		case <-secondWritten:
			t.Fatal("the proxy kept reading during a blackhole")
		default:
		}
		assert.Equal(t, 1, p.Open(), "the connection stays open")

		require.NoError(t, p.SetBlackhole(Upstream, false))
		wrote.Wait()
		assert.Equal(t, "1", <-echo.got)
		assert.Equal(t, "2", <-echo.got)
		buf := make([]byte, 2)
		_, err := io.ReadFull(c, buf)
		require.NoError(t, err)
		assert.Equal(t, "12", string(buf))

		// Downstream only: the request arrives, the reply waits.
		require.NoError(t, p.SetBlackhole(Downstream, true))
		_, err = c.Write([]byte("3"))
		require.NoError(t, err)
		assert.Equal(t, "3", <-echo.got)
		replied := make(chan struct{})
		go func() {
			b := make([]byte, 1)
			_, _ = c.Read(b)
			close(replied)
		}()
		time.Sleep(time.Hour)
		synctest.Wait()
		select {
		case <-replied:
			t.Fatal("a reply crossed a downstream blackhole")
		default:
		}
		require.NoError(t, p.Normal())
		<-replied
	})
}

func TestCloseEndsBlockedConnections(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, ln, _ := startMem(t)
		require.NoError(t, p.SetBlackhole(Both, true))
		require.NoError(t, p.SetLatency(Both, time.Hour))
		c := ln.connect(t)
		defer c.Close()
		go func() { _, _ = c.Write([]byte("held")) }()
		synctest.Wait()
		require.NoError(t, p.Close())
		require.NoError(t, p.Close(), "second Close")
		assert.Zero(t, p.Open())
		_, err := c.Read(make([]byte, 1))
		assert.Error(t, err)
		assert.ErrorContains(t, p.SetRefuse(false), "closed")
	})
}

func TestBadArguments(t *testing.T) {
	for _, target := range []string{"10.0.0.1:5432", "example.com:5432", "nonsense"} {
		_, err := New(target)
		assert.ErrorContains(t, err, "target", target)
	}
	p, err := New("127.0.0.1:1")
	require.NoError(t, err)
	defer p.Close()
	assert.ErrorContains(t, p.SetLatency(Both, -time.Millisecond), "latency")
	assert.ErrorContains(t, p.SetLatency(Direction(0), time.Millisecond), "dir")
	assert.ErrorContains(t, p.SetBlackhole(Direction(7), true), "dir")
	assert.Equal(t, "both", Both.String())
}

// tcpEcho is a real echo server on 127.0.0.1, stopped by the returned function.
func tcpEcho(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, c)
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func TestTCPResetRefuseAndCount(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // runs after the echo server's cleanup
	target := tcpEcho(t)
	p, err := New(target)
	require.NoError(t, err)
	defer p.Close()
	require.Equal(t, target, p.Target())

	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()
	roundTrip(t, c, "hello")
	assert.EqualValues(t, 1, p.Accepted())
	assert.Equal(t, 1, p.Open())

	// Reset: the client reads a RST, not an orderly EOF.
	assert.Equal(t, 1, p.Reset())
	_, err = c.Read(make([]byte, 1))
	assert.ErrorIs(t, err, syscall.ECONNRESET)
	assert.Zero(t, p.Open())

	// Refuse: new connections are refused by the kernel; the address stays.
	addr := p.Addr()
	require.NoError(t, p.SetRefuse(true))
	require.NoError(t, p.SetRefuse(true), "twice")
	_, err = net.Dial("tcp", addr)
	assert.ErrorIs(t, err, syscall.ECONNREFUSED)
	assert.EqualValues(t, 1, p.Accepted(), "a refused connection is not counted")

	require.NoError(t, p.Normal())
	assert.Equal(t, addr, p.Addr())
	c2, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c2.Close()
	roundTrip(t, c2, "again")
	assert.EqualValues(t, 2, p.Accepted())

	// An orderly close by the client reaches the server and comes back.
	require.NoError(t, c2.(*net.TCPConn).CloseWrite())
	_, err = c2.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF)
	require.Eventually(t, func() bool { return p.Open() == 0 }, 5*time.Second, time.Millisecond)

	require.NoError(t, p.Close())
}

// A target that is down: the client is reset at once.
func TestTCPTargetDown(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	target := ln.Addr().String()
	ln.Close()
	p, err := New(target)
	require.NoError(t, err)
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	if err == nil { // else the reset came before the handshake ended
		defer c.Close()
		_, err = c.Read(make([]byte, 1))
	}
	assert.ErrorIs(t, err, syscall.ECONNRESET)
	assert.EqualValues(t, 1, p.Accepted())
	require.NoError(t, p.Close())
}

// slowReadConn returns its read errors a second late, so that a goroutine reading it ends a
// second after the connection is closed.
type slowReadConn struct{ net.Conn }

func (c slowReadConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if err != nil {
		time.Sleep(time.Second)
	}
	return n, err
}

// Close returns only when every goroutine of the proxy has ended: here, a reader that takes a
// second to notice the close.
func TestCloseWaitsForGoroutines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ln := newMemListener()
		echo := &memEcho{got: make(chan string, 100), conns: make(chan net.Conn, 100)}
		dial := func(ctx context.Context) (net.Conn, error) {
			c, err := echo.dial(ctx)
			return slowReadConn{c}, err
		}
		p := start("echo", ln, func() (net.Listener, error) { return nil, errors.New("no") }, dial)
		c := ln.connect(t)
		defer c.Close()
		roundTrip(t, c, "x")

		start := time.Now()
		require.NoError(t, p.Close())
		assert.Equal(t, time.Second, time.Since(start), "Close returned before its goroutines ended")
	})
}
