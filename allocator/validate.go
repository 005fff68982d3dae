package allocator

import (
	"fmt"
	"math"

	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// MaxBatch bounds the items of one batched call.
const MaxBatch = 10000

// ValidateAcquire checks an AcquireLeases request; the error names the
// field, e.g. "requests[2].demand_per_second".
func ValidateAcquire(req *pb.AcquireLeasesRequest) error {
	if err := vocab.ValidateRegion("region", req.GetRegion()); err != nil {
		return err
	}
	if len(req.Requests) == 0 {
		return fieldErr("requests", "at least one request is required")
	}
	if len(req.Requests) > MaxBatch {
		return fieldErr("requests", "at most %d per call, got %d", MaxBatch, len(req.Requests))
	}
	seen := make(map[string]int, len(req.Requests))
	for i, r := range req.Requests {
		f := fmt.Sprintf("requests[%d]", i)
		if r == nil {
			return fieldErr(f, "required")
		}
		if err := vocab.ValidateRequestID(f+".request_id", r.RequestId); err != nil {
			return err
		}
		if j, dup := seen[r.RequestId]; dup {
			return fieldErr(f+".request_id", "duplicates requests[%d]", j)
		}
		seen[r.RequestId] = i
		if err := vocab.ValidateLimitID(f+".limit_id", r.LimitId); err != nil {
			return err
		}
		switch r.Window {
		case pb.WindowChoice_WINDOW_CHOICE_CURRENT, pb.WindowChoice_WINDOW_CHOICE_NEXT:
		default:
			return fieldErr(f+".window", "must be CURRENT or NEXT, got %d", r.Window)
		}
		if math.IsNaN(r.DemandPerSecond) || math.IsInf(r.DemandPerSecond, 0) || r.DemandPerSecond < 0 {
			return fieldErr(f+".demand_per_second", "must be a finite number >= 0, got %v", r.DemandPerSecond)
		}
		if err := vocab.ValidateTokens(f+".held_tokens", r.HeldTokens, 0); err != nil {
			return err
		}
		if err := vocab.ValidateTokens(f+".want_tokens", r.WantTokens, 0); err != nil {
			return err
		}
	}
	return nil
}

// ValidateAcquireShares checks an AcquireShares request: the errors name
// the field, e.g. "requests[2].demand_per_second".
func ValidateAcquireShares(req *pb.AcquireSharesRequest) error {
	if err := vocab.ValidateRegion("region", req.GetRegion()); err != nil {
		return err
	}
	if len(req.Requests) == 0 {
		return fieldErr("requests", "at least one request is required")
	}
	if len(req.Requests) > MaxBatch {
		return fieldErr("requests", "at most %d per call, got %d", MaxBatch, len(req.Requests))
	}
	seen := make(map[string]int, len(req.Requests))
	for i, r := range req.Requests {
		f := fmt.Sprintf("requests[%d]", i)
		if r == nil {
			return fieldErr(f, "required")
		}
		if err := vocab.ValidateRequestID(f+".request_id", r.RequestId); err != nil {
			return err
		}
		if j, dup := seen[r.RequestId]; dup {
			return fieldErr(f+".request_id", "duplicates requests[%d]", j)
		}
		seen[r.RequestId] = i
		if err := vocab.ValidateLimitID(f+".limit_id", r.LimitId); err != nil {
			return err
		}
		if math.IsNaN(r.DemandPerSecond) || math.IsInf(r.DemandPerSecond, 0) || r.DemandPerSecond < 0 {
			return fieldErr(f+".demand_per_second", "must be a finite number >= 0, got %v", r.DemandPerSecond)
		}
		if r.Holder != "" {
			if err := vocab.ValidateRequestID(f+".holder", r.Holder); err != nil {
				return err
			}
		}
		if r.AdmittedTokens < 0 {
			return fieldErr(f+".admitted_tokens", "must be >= 0, got %d", r.AdmittedTokens)
		}
		if r.WouldDenyTokens < 0 {
			return fieldErr(f+".would_deny_tokens", "must be >= 0, got %d", r.WouldDenyTokens)
		}
		if r.WouldDenyChecks < 0 {
			return fieldErr(f+".would_deny_checks", "must be >= 0, got %d", r.WouldDenyChecks)
		}
		if r.HeldSlots < 0 || r.HeldSlots > vocab.MaxTokens {
			return fieldErr(f+".held_slots", "must be 0..%d, got %d", vocab.MaxTokens, r.HeldSlots)
		}
	}
	return nil
}

// ValidateReturn checks a ReturnLeases request.
func ValidateReturn(req *pb.ReturnLeasesRequest) error {
	if err := vocab.ValidateRegion("region", req.GetRegion()); err != nil {
		return err
	}
	if len(req.Returns) == 0 {
		return fieldErr("returns", "at least one return is required")
	}
	if len(req.Returns) > MaxBatch {
		return fieldErr("returns", "at most %d per call, got %d", MaxBatch, len(req.Returns))
	}
	for i, r := range req.Returns {
		f := fmt.Sprintf("returns[%d]", i)
		if r == nil {
			return fieldErr(f, "required")
		}
		if err := vocab.ValidateLimitID(f+".limit_id", r.LimitId); err != nil {
			return err
		}
		if r.LeaseId == "" {
			return fieldErr(f+".lease_id", "required")
		}
		if len(r.LeaseId) > vocab.MaxLeaseIDLen {
			return fieldErr(f+".lease_id", "too long")
		}
		if err := vocab.ValidateTokens(f+".unspent", r.Unspent, 0); err != nil {
			return err
		}
	}
	return nil
}

// ValidateReport checks a ReportUsage request.
func ValidateReport(req *pb.ReportUsageRequest) error {
	if err := vocab.ValidateRegion("region", req.GetRegion()); err != nil {
		return err
	}
	if err := vocab.ValidateRequestID("reporter", req.GetReporter()); err != nil {
		return err
	}
	if len(req.Usage) > MaxBatch {
		return fieldErr("usage", "at most %d per call, got %d", MaxBatch, len(req.Usage))
	}
	for i, u := range req.Usage {
		f := fmt.Sprintf("usage[%d]", i)
		if u == nil {
			return fieldErr(f, "required")
		}
		if err := vocab.ValidateLimitID(f+".limit_id", u.LimitId); err != nil {
			return err
		}
		if u.WindowIndex < 0 {
			return fieldErr(f+".window_index", "must be >= 0")
		}
		// In the order of the fields: the error names the first negative one.
		for _, c := range [...]struct {
			name string
			v    int64
		}{{"admitted", u.Admitted}, {"denied", u.Denied}, {"fallback_admitted", u.FallbackAdmitted},
			{"redis_rollback_tokens", u.RedisRollbackTokens}, {"released", u.Released}, {"settle_overrun", u.SettleOverrun},
			{"would_deny", u.WouldDeny}, {"would_deny_checks", u.WouldDenyChecks}} {
			if c.v < 0 {
				return fieldErr(f+"."+c.name, "must be >= 0, got %d", c.v)
			}
		}
		if _, ok := pb.FallbackKind_name[int32(u.Fallback)]; !ok {
			return fieldErr(f+".fallback", "unknown fallback kind %d", u.Fallback)
		}
	}
	return nil
}
