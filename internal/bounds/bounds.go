// Package bounds is where every Leasehold server's resource bounds are
// set, with the reason for each number: the HTTP servers' timeouts and
// header cap, and the gRPC servers' stream, keepalive and message caps.
// cmd/leasehold builds its servers with them, internal/allocatortest its
// test allocators; docs/security.md lists them.
//
// Nothing here depends on the services, so the message caps are plain
// numbers: bounds_test.go builds the largest request each API allows (from
// the API's own caps: allocator.MaxBatch, limitspec.MaxApplyChanges, the
// id and field lengths) and fails if a cap stops covering it.
package bounds

import (
	"context"
	"errors"
	"io"
	"log"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// HTTP are an HTTP server's bounds. A zero duration means none (as in
// http.Server).
type HTTP struct {
	// ReadHeaderTimeout bounds reading a request's headers: a client
	// that sends them slowly (slowloris) is cut off.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, body included: a body
	// sent at a byte a second is cut off. Go also ends a request's
	// context when it passes, so it must exceed the slowest handler too.
	ReadTimeout time.Duration
	// WriteTimeout bounds a response, from the end of its request's
	// headers: a client that does not read its answer is cut off. It
	// must allow the slowest legitimate response.
	WriteTimeout time.Duration
	// IdleTimeout bounds how long a keep-alive connection waits for its
	// next request.
	IdleTimeout time.Duration
	// MaxHeaderBytes caps a request's header block; a larger one is
	// answered 431 (Go allows 4 KiB of slack above it).
	MaxHeaderBytes int
	// MaxBodyBytes caps a request's body (0: no cap): a handler reading
	// past it gets an *http.MaxBytesError and the connection is closed
	// after the answer (413 from the admin API).
	MaxBodyBytes int64
}

// Service are the bounds of the allocator's HTTP server (the admin API as
// JSON, /status, /metrics, /healthz) and the agent's (/metrics,
// /healthz):
//
//   - ReadHeaderTimeout 5 s: headers are one packet or a few.
//   - ReadTimeout 30 s: the largest body is the admin API's 1 MiB cap
//     (adminhttp.DefaultMaxBodyBytes), 30 s at 35 KB/s; the slowest
//     handler, a write waiting out etcd's 5 s commit timeout, is far
//     shorter.
//   - WriteTimeout 60 s: the slowest response is a /metrics scrape or a
//     /status page of many limits, or a page of 1,000 audit records to a
//     slow client: seconds, not a minute.
//   - IdleTimeout 90 s: longer than a 60 s Prometheus scrape interval, so
//     scrapes reuse their connection.
//   - MaxHeaderBytes 64 KiB: a bearer token and a few cookies are a few
//     KiB; Envoy's default cap is 60 KiB.
//   - MaxBodyBytes 1 MiB: the admin API's own cap; no other endpoint
//     takes a body.
var Service = HTTP{
	ReadHeaderTimeout: 5 * time.Second,
	ReadTimeout:       30 * time.Second,
	WriteTimeout:      60 * time.Second,
	IdleTimeout:       90 * time.Second,
	MaxHeaderBytes:    64 << 10,
	MaxBodyBytes:      1 << 20,
}

// Gateway are the defaults of `leasehold gateway`'s flags. The gateway
// proxies an upstream, so its read and write bounds are configurable, and
// the gateway applies them to proxied requests so that streams work:
//
//   - ReadHeaderTimeout 10 s.
//   - ReadTimeout 60 s: a request's headers and body (an upload longer
//     than that needs a larger -read-timeout); the response may run on.
//   - WriteTimeout 60 s: the upstream must start its answer within it,
//     and a proxied response must make progress (a write) at least that
//     often: a streaming response (server-sent events, a long download)
//     runs as long as it keeps sending, a client that stops reading is
//     cut off.
//   - IdleTimeout 90 s, MaxHeaderBytes 64 KiB: as Service.
//   - MaxBodyBytes 32 MiB: a request body the gateway forwards; an
//     upstream that takes larger uploads needs a larger -max-body-bytes
//     (0: none, the read timeout still bounds it).
var Gateway = HTTP{
	ReadHeaderTimeout: 10 * time.Second,
	ReadTimeout:       60 * time.Second,
	WriteTimeout:      60 * time.Second,
	IdleTimeout:       90 * time.Second,
	MaxHeaderBytes:    64 << 10,
	MaxBodyBytes:      32 << 20,
}

// Server returns an http.Server with b's bounds serving h; errorLog may
// be nil. The read and write timeouts are per connection, as Go sets
// them: a response may not outlast WriteTimeout.
func (b HTTP) Server(h http.Handler, errorLog *log.Logger) *http.Server {
	if b.MaxBodyBytes > 0 {
		h = http.MaxBytesHandler(h, b.MaxBodyBytes)
	}
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: b.ReadHeaderTimeout,
		ReadTimeout:       b.ReadTimeout,
		WriteTimeout:      b.WriteTimeout,
		IdleTimeout:       b.IdleTimeout,
		MaxHeaderBytes:    b.MaxHeaderBytes,
		ErrorLog:          errorLog,
	}
}

// ProxyServer is Server for a handler that proxies (the gateway): the
// read timeout bounds a request's body, from the end of its headers to
// its end, and no longer runs once the body has been read, so a long
// response is not cut off by it; the write timeout bounds the time to
// the response's first write and then each gap between two writes, so a
// streaming response runs as long as it keeps sending while a client
// that stops reading is cut off. Header, idle, header-size and body-size
// bounds are as Server's.
func (b HTTP) ProxyServer(h http.Handler, errorLog *log.Logger) *http.Server {
	if b.MaxBodyBytes > 0 {
		h = http.MaxBytesHandler(h, b.MaxBodyBytes)
	}
	return &http.Server{
		Handler:           perRequest{h: h, read: b.ReadTimeout, write: b.WriteTimeout},
		ReadHeaderTimeout: b.ReadHeaderTimeout,
		IdleTimeout:       b.IdleTimeout,
		MaxHeaderBytes:    b.MaxHeaderBytes,
		ErrorLog:          errorLog,
	}
}

// perRequest sets a request's read and write deadlines as ProxyServer
// says.
type perRequest struct {
	h           http.Handler
	read, write time.Duration
}

func (p perRequest) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	// A request without a body: the server reads the connection in the
	// background at once (to see it close), so a read deadline would end
	// the request's context; the header timeout already bounded it.
	if p.read > 0 && r.Body != nil && r.Body != http.NoBody {
		_ = rc.SetReadDeadline(time.Now().Add(p.read))
		b := &deadlineBody{ReadCloser: r.Body, rc: rc}
		r = r.WithContext(context.WithValue(r.Context(), timedOutKey{}, &b.timedOut))
		r.Body = b
	}
	if p.write > 0 {
		_ = rc.SetWriteDeadline(time.Now().Add(p.write))
		w = &deadlineWriter{ResponseWriter: w, rc: rc, d: p.write}
	}
	p.h.ServeHTTP(w, r)
}

// deadlineBody lifts the read deadline once the whole body has been read,
// so that the server's background read of the connection does not end
// the request while its response runs. A body that failed (the deadline
// passed) keeps it: the server must not go on reading it.
type deadlineBody struct {
	io.ReadCloser
	rc       *http.ResponseController
	done     bool
	timedOut atomic.Bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == io.EOF && !b.done:
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	case errors.Is(err, os.ErrDeadlineExceeded):
		b.timedOut.Store(true)
	}
	return n, err
}

type timedOutKey struct{}

// BodyTimedOut reports whether the body of the request of ctx (served by
// a ProxyServer) failed because the read timeout passed. Go also ends the
// request's context then, so a proxy sees its upstream call canceled; this
// tells it why (408, not 502).
func BodyTimedOut(ctx context.Context) bool {
	b, _ := ctx.Value(timedOutKey{}).(*atomic.Bool)
	return b != nil && b.Load()
}

// deadlineWriter moves the write deadline d past every write.
type deadlineWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
	d  time.Duration
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.d))
	return w.ResponseWriter.Write(p)
}

// Unwrap lets http.ResponseController reach the connection (Flush,
// deadlines).
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// GRPC are a gRPC server's bounds.
type GRPC struct {
	// MaxConcurrentStreams caps the calls in flight on one connection; a
	// client's further calls wait for a free stream (grpc-go queues them).
	MaxConcurrentStreams uint32
	// MaxRecvMsgSize and MaxSendMsgSize cap one message; a larger one
	// fails its call with RESOURCE_EXHAUSTED.
	MaxRecvMsgSize, MaxSendMsgSize int
	// MaxHeaderListSize caps a call's metadata.
	MaxHeaderListSize uint32
	// ConnectionTimeout bounds a new connection's handshake (TLS and the
	// HTTP/2 preface).
	ConnectionTimeout time.Duration
	// KeepaliveMinTime is the shortest interval between a client's pings
	// the server accepts (enforcement): a client pinging more often gets
	// GOAWAY too_many_pings. PermitWithoutStream lets clients ping a
	// connection with no call in flight.
	KeepaliveMinTime    time.Duration
	PermitWithoutStream bool
	// MaxConnectionIdle closes a connection with no call for that long;
	// KeepaliveTime is how long a connection may be silent before the
	// server pings it, KeepaliveTimeout how long the server waits for the
	// ping's answer before it closes the connection (a client that
	// vanished without a FIN is found within Time + Timeout).
	MaxConnectionIdle, KeepaliveTime, KeepaliveTimeout time.Duration
	// StreamWorkers serve calls on long-lived goroutines (0: a new
	// goroutine per call, gRPC's default). A call whose handler goes
	// deeper than a new goroutine's first stack pays for growing and
	// copying it on every call; a worker keeps its grown stack (gRPC
	// renews it every 65,536 calls). When every worker is busy a call
	// gets a goroutine of its own, as without workers.
	StreamWorkers uint32
}

// Message caps, from the APIs' own caps (bounds_test.go builds each
// largest request and checks it fits):
//
//   - The allocator receives at most about 4.8 MB: ReturnLeases of
//     allocator.MaxBatch (10,000) returns, each a 200-byte limit id and a
//     256-byte lease id; AcquireLeases and ReportUsage of 10,000 items are
//     smaller, and so is ApplyLimits of limitspec.MaxApplyChanges (100)
//     limits of the largest definition (about 16 KB: 32 tags of 200+200
//     bytes, a 2,000-byte description, 16 regions). Agents send at most
//     1,000 items a call. 8 MiB leaves room for the caps to grow by half.
//   - The allocator sends at most SyncLimits' reply: every limit of a
//     region in one message, unpaged, and pages of up to 1,000 limits or
//     audit records. 64 MiB is 200,000 limits of 300 bytes (a typical
//     definition) or 3,900 of the largest; a region past that fails its
//     sync with RESOURCE_EXHAUSTED and its agents keep their last
//     snapshot (paging SyncLimits is the way past it). Agents accept the
//     same 64 MiB (regionagent).
//   - The agent receives and sends at most a CheckMulti of 16 limits (a
//     few KB) or an Envoy request with up to 16 limits' descriptors
//     (each entry at most a header's value): 1 MiB.
const (
	AllocatorMaxRecv = 8 << 20
	AllocatorMaxSend = 64 << 20
	AgentMaxMsg      = 1 << 20
)

// Allocator are the bounds of the allocator's gRPC server (Allocator and
// Admin services):
//
//   - MaxConcurrentStreams 128: an agent replica has at most about ten
//     calls in flight (two per kind of batched call, a sync, a report),
//     quotactl one; 128 is room to spare, not 3,000.
//   - Messages: AllocatorMaxRecv, AllocatorMaxSend.
//   - MaxHeaderListSize 64 KiB: a bearer token and a few keys.
//   - ConnectionTimeout 10 s.
//   - Keepalive: clients may ping every 5 s (agents ping every 10 s,
//     regionagent), with or without calls in flight; the server pings a
//     connection silent for 30 s and closes it if the ping is not
//     answered in 10 s, and closes a connection with no call for 5 min
//     (an agent syncs every second, so its connection is never idle).
var Allocator = GRPC{
	MaxConcurrentStreams: 128,
	MaxRecvMsgSize:       AllocatorMaxRecv,
	MaxSendMsgSize:       AllocatorMaxSend,
	MaxHeaderListSize:    64 << 10,
	ConnectionTimeout:    10 * time.Second,
	KeepaliveMinTime:     5 * time.Second,
	PermitWithoutStream:  true,
	MaxConnectionIdle:    5 * time.Minute,
	KeepaliveTime:        30 * time.Second,
	KeepaliveTimeout:     10 * time.Second,
}

// Agent are the bounds of the region agent's gRPC server (RegionAgent,
// Envoy's RateLimitService):
//
//   - MaxConcurrentStreams 1024: a gateway sends its Checks on one
//     connection; at 100,000 Checks/s and 2 ms each, 200 are in flight.
//     More wait for a stream, they are not refused.
//   - Messages: AgentMaxMsg both ways.
//   - StreamWorkers 256: a Check waits on Redis in a handler deeper than
//     a fresh goroutine's stack; without workers, growing that stack was
//     a tenth of the agent's CPU under 64 callers (docs/benchmarks.md).
//   - The rest as Allocator: gateways idle for 5 min reconnect on their
//     next Check.
var Agent = func() GRPC {
	g := Allocator
	g.MaxConcurrentStreams = 1024
	g.MaxRecvMsgSize, g.MaxSendMsgSize = AgentMaxMsg, AgentMaxMsg
	g.StreamWorkers = 256
	return g
}()

// ServerOptions are g's bounds as gRPC server options.
func (g GRPC) ServerOptions() []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.MaxConcurrentStreams(g.MaxConcurrentStreams),
		grpc.MaxRecvMsgSize(g.MaxRecvMsgSize),
		grpc.MaxSendMsgSize(g.MaxSendMsgSize),
		grpc.MaxHeaderListSize(g.MaxHeaderListSize),
		grpc.ConnectionTimeout(g.ConnectionTimeout),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{
			MinTime: g.KeepaliveMinTime, PermitWithoutStream: g.PermitWithoutStream,
		}),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionIdle: g.MaxConnectionIdle, Time: g.KeepaliveTime, Timeout: g.KeepaliveTimeout,
		}),
	}
	if g.StreamWorkers > 0 {
		opts = append(opts, grpc.NumStreamWorkers(g.StreamWorkers))
	}
	return opts
}

// AgentClientKeepalive is how an agent pings its allocator: every 10 s
// of silence, 5 s for the answer, with or without calls in flight, so a
// connection that died without a FIN or RST (a host gone) is found within
// 15 s and redialed. It is at least Allocator.KeepaliveMinTime apart.
var AgentClientKeepalive = keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}
