package bucket

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"leasehold/internal/redistest"
)

// T0 is the fixed instant (Redis ms) the step tables count from.
const T0 = int64(1_700_000_000_000)

// backend is one Redis the same scripts run against.
type backend struct {
	name string
	rdb  *redis.Client
	mr   *miniredis.Miniredis // nil for redis-server
}

// backends starts a real redis-server and a miniredis for t. Every
// behaviour test runs the same steps, with the same Lua source, on both
// ("the same code in both" rule).
func backends(t *testing.T) []backend {
	t.Helper()
	srv := redistest.Start(t)
	mr := miniredis.RunT(t)
	// Freeze miniredis's clock: its TTLs do not tick with real time, so
	// PEXPIRETIME (now + TTL) would drift otherwise. TIME reads it too.
	mr.SetTime(time.Now())
	return []backend{
		{name: "redis-server", rdb: newClient(t, srv.Addr())},
		{name: "miniredis", rdb: newClient(t, mr.Addr()), mr: mr},
	}
}

// loaded returns Buckets on be's client with every script loaded.
func loaded(t *testing.T, ctx context.Context, be backend) *Buckets {
	t.Helper()
	b := New(be.rdb)
	if err := b.Load(ctx); err != nil {
		t.Fatal(err)
	}
	return b
}

func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, DialTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// realRedis starts only a redis-server (load, pipelines, memory).
func realRedis(t testing.TB) (*redistest.Server, *redis.Client) {
	t.Helper()
	srv := redistest.Start(t)
	return srv, newClient(t, srv.Addr())
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// farExpiry is a key expiry safely after Redis's real clock (TIME) in any
// test run, and after every deadline the tables use.
func farExpiry() int64 { return time.Now().Add(2 * time.Hour).UnixMilli() }
