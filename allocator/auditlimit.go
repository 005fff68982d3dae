package allocator

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// Refused attempts are audited, but a principal that floods the Admin API
// with refused calls must not fill etcd (whose quota, once full, stops
// every write, grants included). So every refusal's strings are capped
// (capEvent), and refusals are admitted to the log by a token bucket per
// principal (refusalLimiter); what a bucket drops is counted and written
// as one summary record per principal and outcome when the flood ends
// (no drop for a quiet interval) or, while it lasts, periodically.

// Caps of the strings of a refused attempt's audit event (bytes).
const (
	auditMaxPrincipal = 128
	auditMaxError     = 1024
	auditMaxShort     = 64 // action, role, transport: the service's own words
)

// refusalAudit are the rate limiter's settings.
type refusalAudit struct {
	rate  float64       // refusals per second recorded per principal
	burst int           // refusals recorded at once
	quiet time.Duration // a flood has ended after this long without a drop
	every time.Duration // summary interval while a flood lasts
	max   int           // principals tracked; others share one bucket
}

// overflowPrincipal names the bucket shared by principals beyond max.
const overflowPrincipal = "(other principals)"

// refusalLimiter is a token bucket per principal, with the counts of what
// it dropped. Time is an argument. Safe for concurrent use.
type refusalLimiter struct {
	cfg refusalAudit

	mu      sync.Mutex // protects buckets
	buckets map[string]*refusalBucket
}

type refusalBucket struct {
	tokens   float64
	last     time.Time // when tokens was computed
	role     string
	dropped  map[pb.AuditOutcome]int64 // since since
	since    time.Time                 // first drop not yet summarized
	lastDrop time.Time
}

func newRefusalLimiter(cfg refusalAudit) *refusalLimiter {
	return &refusalLimiter{cfg: cfg, buckets: map[string]*refusalBucket{}}
}

// allow reports whether a refusal of principal at now is recorded; if not,
// it is counted for the principal's summary.
func (l *refusalLimiter) allow(now time.Time, principal, role string, outcome pb.AuditOutcome) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.bucket(now, principal, role)
	b.tokens = min(float64(l.cfg.burst), b.tokens+now.Sub(b.last).Seconds()*l.cfg.rate)
	b.last = now
	if b.tokens >= 1 {
		b.tokens--
		return true
	}
	if b.dropped == nil {
		b.dropped = map[pb.AuditOutcome]int64{}
		b.since = now
	}
	b.dropped[outcome]++
	b.lastDrop = now
	return false
}

// bucket returns principal's bucket (l.mu held). When max principals are
// tracked it first forgets those with a full bucket and nothing to
// summarize; if none can go, principal shares the overflow bucket.
func (l *refusalLimiter) bucket(now time.Time, principal, role string) *refusalBucket {
	if b := l.buckets[principal]; b != nil {
		return b
	}
	if len(l.buckets) >= l.cfg.max {
		for p, b := range l.buckets {
			full := b.tokens+now.Sub(b.last).Seconds()*l.cfg.rate >= float64(l.cfg.burst)
			if full && b.dropped == nil && p != overflowPrincipal {
				delete(l.buckets, p)
			}
		}
	}
	if len(l.buckets) >= l.cfg.max {
		principal, role = overflowPrincipal, ""
		if b := l.buckets[principal]; b != nil {
			return b
		}
	}
	b := &refusalBucket{tokens: float64(l.cfg.burst), last: now, role: role}
	l.buckets[principal] = b
	return b
}

// droppedSummary is what one principal's bucket dropped over an interval.
type droppedSummary struct {
	principal, role string
	from, to        time.Time
	dropped         map[pb.AuditOutcome]int64
}

// due takes the summaries to write at now: of every principal whose flood
// ended (quiet since its last drop) or has lasted an interval; all of
// them if force (shutting down).
func (l *refusalLimiter) due(now time.Time, force bool) []droppedSummary {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []droppedSummary
	for p, b := range l.buckets {
		if b.dropped == nil {
			continue
		}
		if force || now.Sub(b.lastDrop) >= l.cfg.quiet || now.Sub(b.since) >= l.cfg.every {
			out = append(out, droppedSummary{principal: p, role: b.role, from: b.since, to: b.lastDrop, dropped: b.dropped})
			b.dropped = nil
		}
	}
	slices.SortFunc(out, func(x, y droppedSummary) int { return strings.Compare(x.principal, y.principal) })
	return out
}

// summaryEvents are the audit events of one summary: one per outcome.
func (l *refusalLimiter) summaryEvents(s droppedSummary) []*pb.AuditEvent {
	outcomes := make([]pb.AuditOutcome, 0, len(s.dropped))
	for o := range s.dropped {
		outcomes = append(outcomes, o)
	}
	slices.Sort(outcomes)
	var out []*pb.AuditEvent
	for _, o := range outcomes {
		out = append(out, &pb.AuditEvent{
			Action: auditDroppedAction, Principal: s.principal, Role: s.role, Outcome: o,
			Reason: fmt.Sprintf("%d %s attempts of %s from %s to %s not recorded: over the audit rate limit of %g per second (burst %d) per principal",
				s.dropped[o], outcomeName(o), s.principal, s.from.UTC().Format(time.RFC3339Nano), s.to.UTC().Format(time.RFC3339Nano),
				l.cfg.rate, l.cfg.burst),
		})
	}
	return out
}

// auditDroppedAction is the action of a summary of dropped refusals.
const auditDroppedAction = "refusals-dropped"

// summarizeRefusals writes the summaries due at now, one record each.
func (a *Allocator) summarizeRefusals(ctx context.Context, now time.Time, force bool) {
	for _, s := range a.refusals.due(now, force) {
		events := a.refusals.summaryEvents(s)
		id := a.ids.next(now)
		stamp(id, now, events)
		if err := a.putAuditRecord(ctx, id, events); err != nil {
			var n int64
			for _, c := range s.dropped {
				n += c
			}
			a.log.Error("allocator: summary of dropped audit records not recorded", "principal", s.principal, "dropped", n, "err", err)
		}
	}
}

// summarizeLoop writes summaries of dropped refusals every second until
// ctx ends, then what is left.
func (a *Allocator) summarizeLoop(ctx context.Context) {
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			a.summarizeRefusals(sctx, a.opt.now(), true)
			cancel()
			return
		case <-tick.C:
			a.summarizeRefusals(ctx, a.opt.now(), false)
		}
	}
}

// capEvent caps every string of a refused attempt's event, so that no
// value the caller sent is ever copied into the log unbounded: the limit
// id and reason at their own caps, the error text at 1 KiB, the attempted
// limit dropped above 16 KiB.
func capEvent(e *pb.AuditEvent) {
	e.LimitId = vocab.Cap(e.LimitId, vocab.MaxLimitIDLen)
	e.Reason = vocab.Cap(e.Reason, maxReasonLen)
	e.Principal = vocab.Cap(e.Principal, auditMaxPrincipal)
	e.Error = vocab.Cap(e.Error, auditMaxError)
	e.Action = vocab.Cap(e.Action, auditMaxShort)
	e.Role = vocab.Cap(e.Role, auditMaxShort)
	e.Transport = vocab.Cap(e.Transport, auditMaxShort)
}
