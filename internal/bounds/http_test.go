package bounds_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"leasehold/internal/bounds"
)

// short are bounds short enough for a test: the real ones are seconds.
var short = bounds.HTTP{
	ReadHeaderTimeout: 300 * time.Millisecond,
	ReadTimeout:       300 * time.Millisecond,
	WriteTimeout:      300 * time.Millisecond,
	IdleTimeout:       300 * time.Millisecond,
	MaxHeaderBytes:    4 << 10,
	MaxBodyBytes:      1000,
}

// serve serves srv on a loopback port until the test ends.
func serve(t *testing.T, srv *http.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return ln.Addr().String()
}

// servers are both ways of building a server from bounds.
var servers = []struct {
	name  string
	build func(b bounds.HTTP, h http.Handler) *http.Server
}{
	{"Server", func(b bounds.HTTP, h http.Handler) *http.Server { return b.Server(h, nil) }},
	{"ProxyServer", func(b bounds.HTTP, h http.Handler) *http.Server { return b.ProxyServer(h, nil) }},
}

// bodyReader is a handler that reads the whole body and keeps the error.
type bodyReader struct {
	mu       sync.Mutex // protects errs, timedOut
	errs     []error
	timedOut int // requests bounds.BodyTimedOut said timed out
}

func (b *bodyReader) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	_, err := io.ReadAll(r.Body)
	b.mu.Lock()
	b.errs = append(b.errs, err)
	if bounds.BodyTimedOut(r.Context()) {
		b.timedOut++
	}
	b.mu.Unlock()
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
	case err != nil:
		http.Error(w, "reading the body failed", http.StatusBadRequest)
	}
}

func (b *bodyReader) seen() []error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]error(nil), b.errs...)
}

// trickle writes head, then body one byte at a time every gap until the
// connection closes or the body is sent; it returns the body bytes sent
// and what the server answered before closing.
func trickle(t *testing.T, addr, head string, body int, gap time.Duration) (sent int, answer string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	closed := make(chan string)
	go func() {
		b, _ := io.ReadAll(c) // until the server closes
		closed <- string(b)
	}()
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	for sent < body { // bounded: body bytes at most
		select {
		case answer = <-closed:
			return sent, answer
		case <-time.After(gap): // pacing the slow client
		}
		if _, err := c.Write([]byte{'x'}); err != nil {
			break
		}
		sent++
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	return sent, <-closed
}

// TestReadTimeoutCutsASlowBody: a PUT whose 100-byte body comes at a byte
// every 20 ms (2 s in all) is cut off by a 300 ms read timeout: the
// handler's read fails with a deadline error and the connection closes
// before the body is sent.
func TestReadTimeoutCutsASlowBody(t *testing.T) {
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			h := &bodyReader{}
			addr := serve(t, s.build(short, h))
			sent, answer := trickle(t, addr, "PUT /limits/x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n", 100, 20*time.Millisecond)
			t.Logf("sent %d of 100 body bytes; answer %q", sent, firstLine(answer))
			if sent >= 100 {
				t.Errorf("the whole slow body was read: want the read timeout to cut it off")
			}
			errs := h.seen()
			if len(errs) != 1 || !errors.Is(errs[0], os.ErrDeadlineExceeded) {
				t.Errorf("handler's body reads ended with %v, want one deadline error", errs)
			}
			h.mu.Lock()
			defer h.mu.Unlock()
			if want := map[string]int{"Server": 0, "ProxyServer": 1}[s.name]; h.timedOut != want {
				t.Errorf("BodyTimedOut said so for %d requests, want %d", h.timedOut, want)
			}
		})
	}
}

// TestReadHeaderTimeoutCutsSlowHeaders: headers at a byte every 20 ms
// (slowloris) never reach the handler.
func TestReadHeaderTimeoutCutsSlowHeaders(t *testing.T) {
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			var served atomic.Int64
			addr := serve(t, s.build(short, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served.Add(1) })))
			sent, _ := trickle(t, addr, "GET / HTTP/1.1\r\nHost: x\r\n", 100, 20*time.Millisecond)
			if sent >= 100 || served.Load() != 0 {
				t.Errorf("sent %d of 100 header bytes, %d requests served: want the header timeout to close the connection first",
					sent, served.Load())
			}
		})
	}
}

// TestHeaderAndBodyCaps: a header block over MaxHeaderBytes is answered
// 431 and never reaches the handler; a body over MaxBodyBytes fails the
// handler's read with *http.MaxBytesError (answered 413 here).
func TestHeaderAndBodyCaps(t *testing.T) {
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			h := &bodyReader{}
			addr := "http://" + serve(t, s.build(short, h))
			req, _ := http.NewRequest(http.MethodGet, addr, nil)
			req.Header.Set("X-Big", strings.Repeat("h", 16<<10))
			if code := statusOf(t, req); code != http.StatusRequestHeaderFieldsTooLarge {
				t.Errorf("16 KiB of headers: %d, want 431", code)
			}
			if n := len(h.seen()); n != 0 {
				t.Errorf("the handler saw %d requests with too large headers", n)
			}
			req, _ = http.NewRequest(http.MethodPut, addr, strings.NewReader(strings.Repeat("b", 2000)))
			if code := statusOf(t, req); code != http.StatusRequestEntityTooLarge {
				t.Errorf("a 2,000-byte body over a 1,000-byte cap: %d, want 413", code)
			}
			var tooLarge *http.MaxBytesError
			if errs := h.seen(); len(errs) != 1 || !errors.As(errs[0], &tooLarge) {
				t.Errorf("handler's reads: %v, want one *http.MaxBytesError", errs)
			}
			req, _ = http.NewRequest(http.MethodPut, addr, strings.NewReader(strings.Repeat("b", 1000)))
			if code := statusOf(t, req); code != http.StatusOK {
				t.Errorf("a body at the cap: %d, want 200", code)
			}
		})
	}
}

func statusOf(t *testing.T, req *http.Request) int {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// TestIdleTimeoutClosesKeepAlive: a keep-alive connection with no next
// request is closed by the server after IdleTimeout.
func TestIdleTimeoutClosesKeepAlive(t *testing.T) {
	for _, s := range servers {
		t.Run(s.name, func(t *testing.T) {
			addr := serve(t, s.build(short, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") })))
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second)) // far beyond the 300 ms idle timeout
			if n, err := br.Read(make([]byte, 1)); err != io.EOF {
				t.Errorf("idle keep-alive connection: read %d bytes, %v; want the server to close it (EOF)", n, err)
			}
		})
	}
}

// TestProxyServerStreams: a response that writes a chunk every 100 ms for
// 1 s runs to its end under ProxyServer's 300 ms write timeout (it applies
// to each gap between writes), and a bodyless request's context outlives
// the read timeout; Server's per-connection write timeout cuts the same
// response short.
func TestProxyServerStreams(t *testing.T) {
	const chunks = 10
	for _, c := range []struct {
		name string
		full bool
	}{{"ProxyServer", true}, {"Server", false}} {
		t.Run(c.name, func(t *testing.T) {
			var ctxErr atomic.Value
			h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				rc := http.NewResponseController(w)
				for i := range chunks {
					if _, err := fmt.Fprintf(w, "chunk %d\n", i); err != nil {
						return
					}
					_ = rc.Flush()
					select {
					case <-r.Context().Done():
						ctxErr.Store(r.Context().Err())
						return
					case <-time.After(100 * time.Millisecond): // the stream's pace
					}
				}
			})
			build := servers[0].build
			if c.full {
				build = servers[1].build
			}
			addr := serve(t, build(short, h))
			resp, err := http.Get("http://" + addr)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			got := strings.Count(string(b), "chunk ")
			t.Logf("%d of %d chunks; request context: %v", got, chunks, ctxErr.Load())
			if c.full && (got != chunks || ctxErr.Load() != nil) {
				t.Errorf("got %d of %d chunks, context %v: want the whole stream", got, chunks, ctxErr.Load())
			}
			if !c.full && got == chunks {
				t.Errorf("got every chunk of a 1 s response: want the 300 ms write timeout to cut it")
			}
		})
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\r\n")
	return line
}
