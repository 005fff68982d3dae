package bounds_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/allocator"
	"leasehold/internal/bounds"
	"leasehold/internal/limitspec"
	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// maxRegions is how many regions the largest limit names (the allocator's
// --regions; sixteen is more than any deployment has).
const maxRegions = 16

// agentMaxMulti is regionagent's cap on the limits of one CheckMulti.
const agentMaxMulti = 16

func str(n int, c string) string { return strings.Repeat(c, n) }

// largestLimit is a limit with every free-form field at its cap.
func largestLimit(i int) *pb.Limit {
	l := &pb.Limit{
		Id:          fmt.Sprintf("%08d", i) + str(vocab.MaxLimitIDLen-8, "a"),
		LimitTokens: 1 << 60, Window: durationpb.New(time.Hour),
		Mode:     pb.Mode_MODE_BOUNDED,
		Fallback: map[string]*pb.Fallback{}, Tags: map[string]string{},
		Lease:       &pb.LeaseSettings{Ttl: durationpb.New(time.Minute), MinChunk: 1 << 60, MaxChunk: 1 << 60},
		Owner:       str(limitspec.MaxOwnerLen, "o"),
		Description: str(limitspec.MaxDescriptionLen, "d"),
		Version:     1 << 60,
	}
	for r := range maxRegions {
		name := fmt.Sprintf("%02d", r) + str(vocab.MaxRegionLen-2, "r")
		l.Regions = append(l.Regions, name)
		l.Fallback[name] = &pb.Fallback{Kind: pb.FallbackKind_FALLBACK_KIND_LOCAL, LocalTokens: 1 << 60}
	}
	for t := range limitspec.MaxTags {
		l.Tags[fmt.Sprintf("%03d", t)+str(limitspec.MaxTagLen-3, "k")] = str(limitspec.MaxTagLen, "v")
	}
	return l
}

// TestMessageCapsCoverTheAPIs builds the largest request each service
// allows, from the API's own caps, and checks it fits the cap of the
// server that receives it, so a cap raised in the API without the
// message cap fails here rather than in production.
func TestMessageCapsCoverTheAPIs(t *testing.T) {
	limitID := str(vocab.MaxLimitIDLen, "l")
	leaseID := str(vocab.MaxLeaseIDLen, "x")
	reqID := str(vocab.MaxRequestIDLen, "q")
	region := str(vocab.MaxRegionLen, "r")

	returns := &pb.ReturnLeasesRequest{Region: region}
	acquire := &pb.AcquireLeasesRequest{Region: region}
	report := &pb.ReportUsageRequest{Region: region, Reporter: str(vocab.MaxRequestIDLen, "p")}
	for range allocator.MaxBatch {
		returns.Returns = append(returns.Returns, &pb.LeaseReturn{LimitId: limitID, LeaseId: leaseID, Unspent: 1 << 60})
		acquire.Requests = append(acquire.Requests, &pb.LeaseRequest{RequestId: reqID, LimitId: limitID,
			Window: pb.WindowChoice_WINDOW_CHOICE_NEXT, DemandPerSecond: 1e18, HeldTokens: 1 << 60, WantTokens: 1 << 60})
		report.Usage = append(report.Usage, &pb.Usage{LimitId: limitID, WindowIndex: 1 << 40, Admitted: 1 << 60,
			Denied: 1 << 60, FallbackAdmitted: 1 << 60, Fallback: pb.FallbackKind_FALLBACK_KIND_OPEN,
			RedisRollbackTokens: 1 << 60, Released: 1 << 60})
	}
	apply := &pb.ApplyLimitsRequest{Reason: str(4096, "w")}
	for i := range limitspec.MaxApplyChanges {
		apply.Changes = append(apply.Changes, &pb.LimitChange{Change: &pb.LimitChange_Put{Put: largestLimit(i)}, ExpectedVersion: 1 << 60})
	}
	multi := &pb.CheckMultiRequest{}
	multiResp := &pb.CheckMultiResponse{}
	for range agentMaxMulti {
		multi.Checks = append(multi.Checks, &pb.CheckRequest{LimitId: limitID, Cost: 1 << 60, RequestId: reqID})
		multiResp.Results = append(multiResp.Results, &pb.CheckResponse{Reason: pb.Reason(1), Remaining: 1 << 60,
			RetryAfter: durationpb.New(time.Hour), ResetAfter: durationpb.New(time.Hour), LimitTokens: 1 << 60,
			Window: durationpb.New(time.Hour), LimitVersion: 1 << 60})
	}

	for _, c := range []struct {
		name string
		msg  proto.Message
		cap  int
	}{
		{"allocator receives ReturnLeases of MaxBatch", returns, bounds.AllocatorMaxRecv},
		{"allocator receives AcquireLeases of MaxBatch", acquire, bounds.AllocatorMaxRecv},
		{"allocator receives ReportUsage of MaxBatch", report, bounds.AllocatorMaxRecv},
		{"allocator receives ApplyLimits of MaxApplyChanges largest limits", apply, bounds.AllocatorMaxRecv},
		{"agent receives CheckMulti of 16", multi, bounds.AgentMaxMsg},
		{"agent sends CheckMulti's answer of 16", multiResp, bounds.AgentMaxMsg},
	} {
		n := proto.Size(c.msg)
		t.Logf("%s: %d bytes, cap %d (%.0f%%)", c.name, n, c.cap, 100*float64(n)/float64(c.cap))
		if n > c.cap {
			t.Errorf("%s: %d bytes, above the cap of %d", c.name, n, c.cap)
		}
	}

	// What the send cap carries: a SyncLimits answer of 3,900 largest
	// limits (or about 200,000 typical ones), and a page of 1,000 limits
	// each with its previous version.
	sync := &pb.SyncLimitsResponse{}
	for i := range 3900 {
		sync.Limits = append(sync.Limits, largestLimit(i))
	}
	if n := proto.Size(sync); n > bounds.AllocatorMaxSend {
		t.Errorf("SyncLimits of 3,900 largest limits: %d bytes, above the send cap %d", n, bounds.AllocatorMaxSend)
	}
	page := &pb.ListLimitsResponse{}
	for i := range 1000 {
		l := largestLimit(i)
		l.Previous = largestLimit(i)
		page.Limits = append(page.Limits, l)
	}
	if n := proto.Size(page); n > bounds.AllocatorMaxSend {
		t.Errorf("a page of 1,000 largest limits with their previous versions: %d bytes, above the send cap %d", n, bounds.AllocatorMaxSend)
	}
}
