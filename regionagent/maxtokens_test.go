package regionagent

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"leasehold/allocator"
	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// TestMaxTokensEndToEnd: a limit of G = vocab.MaxTokens is accepted by
// the allocator, leased and deposited in a real redis-server, and a cost-1
// Check and a cost-G Check are admitted through the agent's gRPC server;
// G = MaxTokens+1 is refused where the limit is written, naming the field.
func TestMaxTokensEndToEnd(t *testing.T) {
	w := newWorld(t, "eu")
	over := limit("tenant/over", vocab.MaxTokens+1, time.Minute, 15*time.Second, "eu")
	_, err := w.alloc.PutLimit(context.Background(), over, allocator.Change{Reason: "test", Effective: pb.Effective_EFFECTIVE_NOW})
	var fe *vocab.FieldError
	if !errors.As(err, &fe) || fe.Field != "limit.limit_tokens" {
		t.Fatalf("PutLimit of G = MaxTokens+1: %v, want a FieldError naming limit.limit_tokens", err)
	}

	l := limit("tenant/max", vocab.MaxTokens, time.Minute, 15*time.Second, "eu")
	l.Lease.MinChunk = vocab.MaxTokens // the first lease takes the whole window
	l = w.putLimit(l)
	w.clock.Add(time.Second)
	a := w.agent("eu", "r1")
	cl := serveAgent(t, a)
	ctx := context.Background()
	a.Check(ctx, l.Id, 1) // cold: asks for the first lease
	a.evaluate(ctx, l.Id)
	resp, err := cl.Check(ctx, &pb.CheckRequest{LimitId: l.Id, Cost: 1})
	if err != nil || !resp.Allowed || resp.LimitTokens != vocab.MaxTokens || resp.Remaining != vocab.MaxTokens-1 {
		t.Fatalf("cost-1 Check of G = MaxTokens: %v %v; want allowed, %d remaining", resp, err, vocab.MaxTokens-1)
	}
	resp, err = cl.Check(ctx, &pb.CheckRequest{LimitId: l.Id, Cost: vocab.MaxTokens - 1})
	if err != nil || !resp.Allowed || resp.Remaining != 0 {
		t.Fatalf("Check of the rest (MaxTokens-1): %v %v; want allowed, 0 remaining", resp, err)
	}
	_, err = cl.Check(ctx, &pb.CheckRequest{LimitId: l.Id, Cost: vocab.MaxTokens + 1})
	if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), "cost:") {
		t.Fatalf("Check of cost MaxTokens+1: %v, want InvalidArgument naming cost", err)
	}
	_, err = cl.Reserve(ctx, &pb.ReserveRequest{LimitId: l.Id, Tokens: vocab.MaxTokens + 1, ReservationId: "big"})
	if st, _ := status.FromError(err); st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), "tokens:") {
		t.Fatalf("Reserve of MaxTokens+1: %v, want InvalidArgument naming tokens", err)
	}
}

// TestReleaseMoreThanReserved: a Release naming more unspent tokens than
// its reservation holds is the caller's error: InvalidArgument naming
// unspent, in plain words (no script internals), and it changes nothing.
func TestReleaseMoreThanReserved(t *testing.T) {
	w := newWorld(t, "eu")
	l := limit("tenant/release", 100, time.Minute, 15*time.Second, "eu")
	l.Lease.MinChunk = 100
	l = w.putLimit(l)
	w.clock.Add(time.Second)
	a := w.agent("eu", "r1")
	cl := serveAgent(t, a)
	ctx := context.Background()
	a.Check(ctx, l.Id, 1)
	a.evaluate(ctx, l.Id)
	r, err := cl.Reserve(ctx, &pb.ReserveRequest{LimitId: l.Id, Tokens: 10, ReservationId: "client-1"})
	if err != nil || r.Granted != 10 {
		t.Fatalf("reserve: %v %v", r, err)
	}
	_, err = cl.Release(ctx, &pb.ReleaseRequest{LimitId: l.Id, ReservationId: "client-1", Unspent: 11})
	st, _ := status.FromError(err)
	if st.Code() != codes.InvalidArgument || !strings.HasPrefix(st.Message(), "unspent:") {
		t.Fatalf("release of 11 from a reservation of 10: %v, want InvalidArgument naming unspent", err)
	}
	for _, leak := range []string{"bucket", "script", "ERR", "out of range", "lua"} {
		if strings.Contains(st.Message(), leak) {
			t.Errorf("the message %q shows internals (%q)", st.Message(), leak)
		}
	}
	// Nothing changed: the right release still gives back what it names.
	got, err := cl.Release(ctx, &pb.ReleaseRequest{LimitId: l.Id, ReservationId: "client-1", Unspent: 10})
	if err != nil || got.Returned != 10 {
		t.Fatalf("release of 10 after the refused one: %v %v", got, err)
	}
}
