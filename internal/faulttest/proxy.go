package faulttest

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a TCP proxy between a client and one target (an allocator, a
// Redis) whose faults can be switched at any time; every switch affects
// live connections at once:
//
//   - SetDelay(d): every chunk is held d before it is forwarded, in each
//     direction (a one-way delay: 40 ms each way is an 80 ms round trip).
//   - DropReplies(true): client->server bytes are forwarded, server->client
//     bytes are discarded: the server acts, the client times out (the
//     ambiguous case). gRPC multiplexes every call on one HTTP/2
//     connection, so the whole connection stalls.
//   - Blackhole(true): connections are accepted, nothing is forwarded either
//     way.
//   - Reset(): every live connection is closed with a TCP RST.
//
// A connection that lost bytes (dropped or blackholed) cannot carry a
// byte stream any more, so when forwarding resumes (DropReplies(false),
// Blackhole(false)) it is reset instead of delivering a stream with a hole:
// the client reconnects, as it would after a real partition that outlived
// its connection.
//
// Safe for concurrent use. Loopback only; everything stops in t.Cleanup.
type Proxy struct {
	t      testing.TB
	target string
	ln     net.Listener

	mu     sync.Mutex // protects the fields below
	delay  time.Duration
	drop   bool
	hole   bool
	conns  map[*proxyConn]struct{}
	closed bool

	wg sync.WaitGroup

	accepted  atomic.Int64
	forwarded [2]atomic.Int64 // bytes, by direction
	discarded [2]atomic.Int64
}

// Directions of a proxied connection.
const (
	ToServer = 0 // client -> target
	ToClient = 1 // target -> client
)

type proxyConn struct {
	client, server *net.TCPConn
	tainted        [2]atomic.Bool // by direction: bytes were discarded, the stream has a hole
	once           sync.Once
}

// reset closes both sides with RST (linger 0).
func (c *proxyConn) reset() {
	c.once.Do(func() {
		for _, s := range []*net.TCPConn{c.client, c.server} {
			if s != nil {
				_ = s.SetLinger(0)
				_ = s.Close()
			}
		}
	})
}

// NewProxy listens on 127.0.0.1:0 and forwards each accepted connection to
// target.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("faulttest: proxy listen: %v", err)
	}
	p := &Proxy{t: t, target: target, ln: ln, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(p.Close)
	return p
}

// Addr is the address clients dial.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// SetDelay holds every chunk d before forwarding it, in each direction.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	p.delay = max(0, d)
	p.mu.Unlock()
}

// DropReplies discards what the target sends while on; the client's
// requests still reach it.
func (p *Proxy) DropReplies(on bool) {
	p.mu.Lock()
	p.drop = on
	p.mu.Unlock()
	if !on {
		p.resetTainted()
	}
}

// Blackhole forwards nothing either way while on.
func (p *Proxy) Blackhole(on bool) {
	p.mu.Lock()
	p.hole = on
	p.mu.Unlock()
	if !on {
		p.resetTainted()
	}
}

// Reset closes every live connection with a TCP RST. New connections are
// accepted as before.
func (p *Proxy) Reset() {
	for _, c := range p.live() {
		c.reset()
	}
}

// Accepted is how many connections the proxy accepted.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// Forwarded and Discarded count bytes in a direction (ToServer, ToClient).
func (p *Proxy) Forwarded(dir int) int64 { return p.forwarded[dir].Load() }

// Discarded counts bytes dropped in a direction (ToServer, ToClient).
func (p *Proxy) Discarded(dir int) int64 { return p.discarded[dir].Load() }

// Close stops accepting, resets every connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	already := p.closed
	p.closed = true
	p.mu.Unlock()
	if already {
		return
	}
	_ = p.ln.Close()
	p.Reset()
	p.wg.Wait()
}

func (p *Proxy) live() []*proxyConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		out = append(out, c)
	}
	return out
}

func (p *Proxy) resetTainted() {
	for _, c := range p.live() {
		if c.tainted[ToServer].Load() || c.tainted[ToClient].Load() {
			c.reset()
		}
	}
}

// mode returns what to do with a chunk read now in direction dir.
func (p *Proxy) mode(dir int) (forward bool, delay time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hole || (dir == ToClient && p.drop) {
		return false, 0
	}
	return true, p.delay
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.accepted.Add(1)
		p.wg.Add(1)
		go p.serve(c.(*net.TCPConn))
	}
}

func (p *Proxy) serve(client *net.TCPConn) {
	defer p.wg.Done()
	sc, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		// The target is down: the client sees a reset, as it would
		// dialing the target itself.
		_ = client.SetLinger(0)
		_ = client.Close()
		return
	}
	c := &proxyConn{client: client, server: sc.(*net.TCPConn)}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.reset()
		return
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(c, c.client, c.server, ToServer) }()
	go func() { defer wg.Done(); p.pipe(c, c.server, c.client, ToClient) }()
	wg.Wait()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

type chunk struct {
	b   []byte
	due time.Time
}

// pipe copies src to dst chunk by chunk, applying the proxy's mode to each
// chunk when it is read. A delayed chunk waits on a timer in a writer
// goroutine, so delays pipeline (throughput is kept, only latency grows).
// When either side fails the whole connection is reset.
func (p *Proxy) pipe(c *proxyConn, src, dst *net.TCPConn, dir int) {
	defer c.reset()
	out := make(chan chunk, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		timer := time.NewTimer(time.Hour)
		defer timer.Stop()
		for ch := range out {
			if d := time.Until(ch.due); d > 0 {
				timer.Reset(d)
				<-timer.C
			}
			// Counted before the write, so that a peer that has read the
			// bytes never sees a count without them (TestProxyForwards
			// once read 15/10: its echo arrived before the count); a
			// write that fails takes back what it did not write.
			p.forwarded[dir].Add(int64(len(ch.b)))
			if n, err := dst.Write(ch.b); err != nil {
				p.forwarded[dir].Add(-int64(len(ch.b) - n))
				c.reset()
				for range out { // drain until the reader stops
				}
				return
			}
		}
	}()
	defer func() { close(out); <-done }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			forward, delay := p.mode(dir)
			if !forward {
				c.tainted[dir].Store(true)
				p.discarded[dir].Add(int64(n))
			} else if c.tainted[dir].Load() {
				return // a stream with a hole: reset rather than deliver it
			} else {
				b := make([]byte, n)
				copy(b, buf[:n])
				out <- chunk{b: b, due: time.Now().Add(delay)}
			}
		}
		if err != nil {
			return // EOF, reset or closed: the connection is over either way
		}
	}
}
