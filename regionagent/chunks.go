package regionagent

import (
	"context"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"leasehold/internal/history"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent/client"
)

// Hot limits are decided in memory. A replica whose own traffic on a
// limit passes ChunkConfig.HotRate reserves a chunk of the region's
// balance from the shared bucket (Reserve: atomic, at most what the
// region holds, its deadline never later than the leases it came from),
// sized to its own rate over ChunkConfig.Horizon, and spends it with one
// atomic update per Check, no Redis call and no lock shared by other
// limits. What is left goes back to the leases it came from when the
// chunk ends (Release). It is the Go client's sub-lease machinery, run in
// the agent against the agent itself (client.NewInProcess), so there is
// one copy of it. Cold and slow limits, CheckMulti, costs a chunk cannot
// cover and every denial go the core's way (Redis, in batches).

// ChunkConfig sets how the agent decides hot limits from chunks.
type ChunkConfig = client.SubLeaseConfig

// DefaultChunks is the setting to turn chunks on with: a limit is hot
// at 50 cost/s on one replica; a chunk covers 250 ms of that replica's
// rate and is given back after 1 s unused. A limit is warm from 1 cost/s
// on one replica when its G is 128 or more: its chunk covers 4 s of the
// replica's rate, at most 1/64 of G, and is given back after 2 s unused.
// In this package chunks are off unless WithChunks turns them on;
// `leasehold agent` turns them on with this setting (its
// -chunk-hot-rate and -chunk-warm-rate).
var DefaultChunks = ChunkConfig{HotRate: 50, Horizon: 250 * time.Millisecond, IdleAfter: time.Second,
	WarmRate: 1, WarmHorizon: client.DefaultWarmHorizon}

// chunkCandidate reports whether the chunks' client should hear of a
// Check's limit, given the region's demand for it (cost/s) and how long
// before this Check the replica last checked it (0: never). A limit can be
// hot or warm on this replica only with the region's demand at half the
// rate that makes it so (a replica's rate is at most the region's), or if
// it was checked twice within chunkRecall: traffic that resumes after a
// rest, which the demand measure, spanning a second and more, follows
// late. The client keeps no state for the others, so limits checked once
// (a cold key) or measured slow cost it nothing.
func (a *Agent) chunkCandidate(demand float64, since time.Duration) bool {
	gate := a.opt.chunks.HotRate
	if w := a.opt.chunks.WarmRate; w > 0 {
		gate = min(gate, w)
	}
	return demand >= gate/2 || since > 0 && since <= chunkRecall
}

// chunkRecall is how far apart two Checks of a limit may be for the
// second to tell the chunks' client of it: the time the client keeps an
// idle limit's state, so the client knows what it would still remember
// had it heard of the limit at its first Check.
const chunkRecall = client.StateTTL

// WithChunks turns deciding hot limits in memory on (cfg.HotRate > 0,
// e.g. DefaultChunks); without it, or with cfg.HotRate <= 0, every Check
// goes to Redis.
func WithChunks(cfg ChunkConfig) Option {
	return func(o *options) {
		if cfg.HotRate > 0 {
			cfg = cfg.WithDefaults() // the agent reads the horizons too (chunkAhead)
		}
		o.chunks = cfg
	}
}

// newChunks returns the in-process client that holds the agent's chunks
// (nil when they are off).
func (a *Agent) newChunks() *client.Client {
	if a.opt.chunks.HotRate <= 0 {
		return nil
	}
	opts := []client.Option{client.WithSubLeases(a.opt.chunks), client.WithClock(a.opt.now), client.WithReleaseLead(chunkReleaseLead),
		client.WithTimeout(a.opt.redisTimeout + time.Second), client.WithoutDenialCache(),
		client.WithReleaseObserver(a.m.observeChunkRelease)}
	if a.opt.hist != nil {
		opts = append(opts, client.WithLocalDecisionObserver(
			ClientDecisionRecorder(a.opt.hist, a.cfg.ReplicaID, a.cfg.Region, history.PathChunk)))
	}
	return client.NewInProcess(selfRPC{NewServer(a)}, "ag-"+a.cfg.ReplicaID+"-"+a.nonce+"-", opts...)
}

// chunkReleaseLead ends each chunk this long before the lease it came
// from: the sweep that retires it (every 250 ms) and its Release land
// while the lease is open, so what is left goes back to the region's
// bucket and, unspent, to the allocator; the lease's last moments are
// spent through Redis. A chunk given back after its lease closed was lost
// to the window (TestEndToEnd: 8-16 tokens of 600 a window).
const chunkReleaseLead = 500 * time.Millisecond

// fromChunk decides a single Check from a chunk, if one can.
func (a *Agent) fromChunk(ctx context.Context, limit string, cost int64) (Decision, bool) {
	if a.chunks == nil {
		return Decision{}, false
	}
	d, ok := a.chunks.AllowSubLease(ctx, limit, cost)
	if !ok {
		return Decision{}, false
	}
	a.m.checkOK.Inc()
	a.m.chunkChecks.Inc()
	return Decision{Allowed: true, Reason: d.Reason, Remaining: d.Remaining, ResetAfter: d.ResetAfter,
		Limit: d.Limit, Window: d.Window, Version: d.Version}, true
}

// chunkAhead is how long a chunk's tokens are spent from memory after
// its reservation was written (a Redis failover that forgets the write
// forgets them too: the rollback estimate covers this span).
func (a *Agent) chunkAhead() time.Duration {
	if a.chunks == nil {
		return 0
	}
	// The horizon sizes a chunk at the replica's rate (a warm limit's,
	// the warm horizon); a chunk may be spent for longer (the rate fell,
	// the renewal lead), so at least 1 s counts.
	ahead := max(a.opt.chunks.Horizon, time.Second)
	if a.opt.chunks.WarmRate > 0 {
		ahead = max(ahead, a.opt.chunks.WarmHorizon)
	}
	return ahead
}

// closeChunks gives back what the chunks hold.
func (a *Agent) closeChunks() {
	if a.chunks == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := a.chunks.Close(ctx); err != nil {
		a.log.Warn("giving back chunks", "err", err)
	}
}

// selfRPC is the agent's own RegionAgent service called in process: the
// chunk client reserves and releases through it (Check and CheckMulti it
// never sends).
type selfRPC struct{ s *Server }

func (s selfRPC) Check(context.Context, *pb.CheckRequest, ...grpc.CallOption) (*pb.CheckResponse, error) {
	return nil, status.Error(codes.Unimplemented, "chunks never Check")
}

func (s selfRPC) CheckMulti(context.Context, *pb.CheckMultiRequest, ...grpc.CallOption) (*pb.CheckMultiResponse, error) {
	return nil, status.Error(codes.Unimplemented, "chunks never Check")
}

func (s selfRPC) Reserve(ctx context.Context, req *pb.ReserveRequest, _ ...grpc.CallOption) (*pb.ReserveResponse, error) {
	return s.s.Reserve(ctx, req)
}

func (s selfRPC) Release(ctx context.Context, req *pb.ReleaseRequest, _ ...grpc.CallOption) (*pb.ReleaseResponse, error) {
	return s.s.Release(ctx, req)
}

func (s selfRPC) Settle(context.Context, *pb.SettleRequest, ...grpc.CallOption) (*pb.SettleResponse, error) {
	return nil, status.Error(codes.Unimplemented, "chunks never Settle")
}

func (s selfRPC) AcquireSlot(context.Context, *pb.AcquireSlotRequest, ...grpc.CallOption) (*pb.AcquireSlotResponse, error) {
	return nil, status.Error(codes.Unimplemented, "chunks never hold slots")
}

func (s selfRPC) HeartbeatSlot(context.Context, *pb.HeartbeatSlotRequest, ...grpc.CallOption) (*pb.HeartbeatSlotResponse, error) {
	return nil, status.Error(codes.Unimplemented, "chunks never hold slots")
}

func (s selfRPC) ReleaseSlot(context.Context, *pb.ReleaseSlotRequest, ...grpc.CallOption) (*pb.ReleaseSlotResponse, error) {
	return nil, status.Error(codes.Unimplemented, "chunks never hold slots")
}
