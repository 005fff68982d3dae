package allocator

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/encoding/protodelim"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"leasehold/allocator/auth"
	pb "leasehold/proto/leasehold/v1"
)

// The audit log and the limits' history live in etcd next to the limits:
//
//	<prefix>audit/<record id>                     one audit record: the events of one call
//	<prefix>history/<limit id>!<event id>         one applied change of one limit
//
// A record id is "<unix ns, 20 digits>-<8 hex digits>": it sorts by time,
// and the random part keeps ids unique across replicas. An event id is
// "<record id>.<index in the record, 3 digits>". An applied change writes
// its record, its history entries and the limit itself in one fenced
// transaction, so the log never misses a change and never shows one that
// did not happen. A refused attempt is one record written on its own.
// The leader removes records older than the audit retention (with the
// history entries they name), oldest first.

const (
	recordIDLen = 20 + 1 + 8      // "<unix ns, 20 digits>-<8 hex digits>"
	eventIDLen  = recordIDLen + 4 // + ".<3 digits>"
	idxDigits   = 3               // event index in a record
	maxEvents   = 1000            // events in one record (an apply is capped lower)
	maxEventLen = 4 << 20         // bytes of one encoded event
	auditCap    = 16 << 10        // attempted values larger than this are not copied into refusals
	nsDigits    = "%020d"
)

// adminMetrics count the Admin service's audit records and refusals.
type adminMetrics struct {
	audit           *prometheus.CounterVec
	auditDropped    *prometheus.CounterVec
	auditSwept      prometheus.Counter
	unauthenticated prometheus.Counter
	changeDur       prometheus.Histogram
}

func newAdminMetrics(reg prometheus.Registerer) *adminMetrics {
	m := &adminMetrics{
		audit: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_admin_audit_events_total",
			Help: "Audit events recorded, by outcome: applied, denied, conflict, invalid.",
		}, []string{"outcome"}),
		auditDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leasehold_admin_audit_dropped_total",
			Help: "Refused admin attempts not recorded in the audit log because their principal was over the audit rate limit, by outcome (a summary record counts them).",
		}, []string{"outcome"}),
		auditSwept: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_admin_audit_records_swept_total",
			Help: "Audit records removed because they were older than the audit retention.",
		}),
		unauthenticated: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "leasehold_admin_unauthenticated_total",
			Help: "Admin calls refused because they carried no principal while authentication is on (logged, not audited).",
		}),
		changeDur: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "leasehold_admin_change_duration_seconds",
			Help:    "Time to apply a limit change, its history and its audit record in one etcd transaction.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
	}
	if reg != nil {
		reg.MustRegister(m.audit, m.auditDropped, m.auditSwept, m.unauthenticated, m.changeDur)
	}
	return m
}

func (s *Store) auditPrefix() string             { return s.prefix + "audit/" }
func (s *Store) auditKey(recordID string) string { return s.prefix + "audit/" + recordID }
func (s *Store) historyPrefix(limit string) string {
	return s.prefix + "history/" + limit + "!"
}
func (s *Store) historyKey(limit, eventID string) string { return s.historyPrefix(limit) + eventID }

type transportKey struct{}

// WithTransport returns ctx naming the transport a call came by ("grpc",
// "http"); the audit log records it. Calls without one are "grpc".
func WithTransport(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, transportKey{}, name)
}

func transportOf(ctx context.Context) string {
	if t, ok := ctx.Value(transportKey{}).(string); ok && t != "" {
		return t
	}
	return "grpc"
}

// auditIDs makes record ids: time-ordered in this process even when the
// clock stands still or steps back, unique across replicas.
type auditIDs struct {
	mu   sync.Mutex // protects last
	last int64
}

func (g *auditIDs) next(now time.Time) string {
	g.mu.Lock()
	ns := max(now.UnixNano(), g.last+1)
	g.last = ns
	g.mu.Unlock()
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf(nsDigits+"-%s", ns, hex.EncodeToString(b[:]))
}

func eventID(recordID string, i int) string {
	return fmt.Sprintf("%s.%0*d", recordID, idxDigits, i)
}

// parseRecordID checks a record id and returns its time in unix ns.
func parseRecordID(id string) (int64, error) {
	if len(id) != recordIDLen || id[20] != '-' {
		return 0, fmt.Errorf("record id %q: want <20 digits>-<8 hex digits>", id)
	}
	for _, c := range id[:20] {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("record id %q: want <20 digits>-<8 hex digits>", id)
		}
	}
	for _, c := range id[21:] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return 0, fmt.Errorf("record id %q: want <20 digits>-<8 hex digits>", id)
		}
	}
	ns, err := strconv.ParseInt(id[:20], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("record id %q: %v", id, err)
	}
	return ns, nil
}

// parseEventID splits an event id (also the page token of ListAudit and
// LimitHistory) into its record id and index.
func parseEventID(id string) (recordID string, index int, err error) {
	if len(id) != eventIDLen || id[recordIDLen] != '.' {
		return "", 0, fmt.Errorf("event id %q: want <record id>.<3 digits>", id)
	}
	if _, err := parseRecordID(id[:recordIDLen]); err != nil {
		return "", 0, err
	}
	for _, c := range id[recordIDLen+1:] {
		if c < '0' || c > '9' {
			return "", 0, fmt.Errorf("event id %q: want <record id>.<3 digits>", id)
		}
	}
	i, _ := strconv.Atoi(id[recordIDLen+1:])
	return id[:recordIDLen], i, nil
}

// encodeAuditRecord encodes the events of one record: each event
// size-delimited (a varint length, then the protobuf message).
func encodeAuditRecord(events []*pb.AuditEvent) ([]byte, error) {
	var buf bytes.Buffer
	for _, e := range events {
		if _, err := protodelim.MarshalTo(&buf, e); err != nil {
			return nil, err
		}
	}
	return buf.Bytes(), nil
}

// decodeAuditRecord decodes a record written by encodeAuditRecord. It
// fails (never panics) on any malformed input.
func decodeAuditRecord(b []byte) ([]*pb.AuditEvent, error) {
	r := bufio.NewReader(bytes.NewReader(b))
	var out []*pb.AuditEvent
	for {
		e := &pb.AuditEvent{}
		err := protodelim.UnmarshalOptions{MaxSize: maxEventLen}.UnmarshalFrom(r, e)
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("audit record: event %d: %w", len(out), err)
		}
		if len(out) == maxEvents {
			return nil, fmt.Errorf("audit record: more than %d events", maxEvents)
		}
		out = append(out, e)
	}
}

// newEvent starts an audit event of principal p.
func newEvent(ctx context.Context, p *auth.Principal, action, limit, reason string) *pb.AuditEvent {
	e := &pb.AuditEvent{Action: action, LimitId: limit, Reason: reason, Transport: transportOf(ctx)}
	if p != nil {
		e.Principal, e.Role = p.Name, p.Role.String()
	}
	return e
}

// stamp gives the events of one record their ids and time.
func stamp(recordID string, now time.Time, events []*pb.AuditEvent) {
	ts := timestamppb.New(now)
	for i, e := range events {
		e.Id, e.Time = eventID(recordID, i), ts
	}
}

// recordRefusal writes one refused attempt in its own write, its strings
// capped (capEvent), unless the principal's audit rate limit drops it:
// then it is counted, and a summary record says later how many were
// dropped. A failure to record is logged: the caller is refused either
// way.
func (a *Allocator) recordRefusal(ctx context.Context, e *pb.AuditEvent, outcome pb.AuditOutcome, cause error) {
	e.Outcome, e.Error = outcome, cause.Error()
	capEvent(e)
	now := a.opt.now()
	if !a.refusals.allow(now, e.Principal, e.Role, outcome) {
		a.am.auditDropped.WithLabelValues(outcomeName(outcome)).Inc()
		return
	}
	if e.New != nil && proto.Size(e.New) > auditCap {
		e.New = nil
	}
	id := a.ids.next(now)
	stamp(id, now, []*pb.AuditEvent{e})
	err := a.putAuditRecord(ctx, id, []*pb.AuditEvent{e})
	a.am.audit.WithLabelValues(outcomeName(outcome)).Inc()
	if err != nil {
		a.log.Error("allocator: refused attempt not recorded in the audit log", "principal", e.Principal,
			"action", e.Action, "limit", e.LimitId, "outcome", outcome, "err", err)
	}
}

// putAuditRecord writes one record on its own (not fenced: followers
// record refusals too).
func (a *Allocator) putAuditRecord(ctx context.Context, id string, events []*pb.AuditEvent) error {
	b, err := encodeAuditRecord(events)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, err = a.cfg.Client.Put(wctx, a.store.auditKey(id), string(b))
	return err
}

func outcomeName(o pb.AuditOutcome) string {
	return strings.ToLower(strings.TrimPrefix(o.String(), "AUDIT_OUTCOME_"))
}

// AuditPage is one page of events and the token of the next ("" at the end).
type AuditPage struct {
	Events []*pb.AuditEvent
	Next   string
}

// maxScanRecords bounds the records one ListAudit call reads while a
// filter skips events: it then returns fewer events and a token.
const maxScanRecords = 5000

// ListAudit returns audit events at or after since (zero: all) whose limit
// id starts with prefix, oldest first, size at most, after the page token.
func (s *Store) ListAudit(ctx context.Context, since time.Time, prefix string, size int, token string) (AuditPage, error) {
	from := s.auditPrefix()
	skipRecord, skipUpTo := "", -1
	if !since.IsZero() && since.UnixNano() > 0 {
		from = s.auditKey(fmt.Sprintf(nsDigits, since.UnixNano()))
	}
	if token != "" {
		rid, idx, err := parseEventID(token)
		if err != nil {
			return AuditPage{}, fieldErr("page_token", "%v", err)
		}
		if k := s.auditKey(rid); k > from {
			from = k
		}
		skipRecord, skipUpTo = rid, idx
	}
	end := clientv3.GetPrefixRangeEnd(s.auditPrefix())
	var page AuditPage
	last := "" // the last event id looked at
	scanned := 0
	for {
		const chunk = 100
		resp, err := s.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(chunk))
		if err != nil {
			return AuditPage{}, fmt.Errorf("allocator: list audit: %w", err)
		}
		for _, kv := range resp.Kvs {
			rid := string(kv.Key[len(s.auditPrefix()):])
			events, err := decodeAuditRecord(kv.Value)
			if err != nil {
				return AuditPage{}, fmt.Errorf("allocator: %s: %w", kv.Key, err)
			}
			scanned++
			for i, e := range events {
				if rid == skipRecord && i <= skipUpTo {
					continue
				}
				if len(page.Events) == size {
					page.Next = last
					return page, nil
				}
				last = eventID(rid, i)
				if strings.HasPrefix(e.LimitId, prefix) {
					page.Events = append(page.Events, e)
				}
			}
			if scanned >= maxScanRecords && resp.More {
				page.Next = last
				return page, nil
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return page, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// LimitHistory returns the applied changes of one limit, oldest first,
// size at most, after the page token (an event id).
func (s *Store) LimitHistory(ctx context.Context, limit string, size int, token string) (AuditPage, error) {
	from := s.historyPrefix(limit)
	end := clientv3.GetPrefixRangeEnd(from)
	if token != "" {
		if _, _, err := parseEventID(token); err != nil {
			return AuditPage{}, fieldErr("page_token", "%v", err)
		}
		from = s.historyKey(limit, token) + "\x00"
	}
	resp, err := s.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(int64(size)))
	if err != nil {
		return AuditPage{}, fmt.Errorf("allocator: limit history: %w", err)
	}
	var page AuditPage
	for _, kv := range resp.Kvs {
		e := &pb.AuditEvent{}
		if err := proto.Unmarshal(kv.Value, e); err != nil {
			return AuditPage{}, fmt.Errorf("allocator: decode %s: %w", kv.Key, err)
		}
		page.Events = append(page.Events, e)
	}
	if resp.More && len(page.Events) > 0 {
		page.Next = page.Events[len(page.Events)-1].Id
	}
	return page, nil
}

// sweepAudit removes audit records older than the audit retention, and
// the history entries of the changes they record, in fenced batches.
func (a *Allocator) sweepAudit(t *term) error {
	cutoff := a.opt.now().Add(-a.opt.auditRetention)
	if cutoff.UnixNano() <= 0 {
		return nil
	}
	end := a.store.auditKey(fmt.Sprintf(nsDigits, cutoff.UnixNano()))
	batch := max(1, a.opt.maxOps/4)
	for t.ctx.Err() == nil {
		resp, err := a.cfg.Client.Get(t.ctx, a.store.auditPrefix(), clientv3.WithRange(end), clientv3.WithLimit(int64(batch)))
		if err != nil {
			return err
		}
		if len(resp.Kvs) == 0 {
			return nil
		}
		var ops []clientv3.Op
		for _, kv := range resp.Kvs {
			events, err := decodeAuditRecord(kv.Value)
			if err != nil {
				a.log.Error("allocator: undecodable audit record removed", "key", string(kv.Key), "err", err)
			}
			for _, e := range events {
				if e.Outcome == pb.AuditOutcome_AUDIT_OUTCOME_APPLIED && e.LimitId != "" {
					ops = append(ops, clientv3.OpDelete(a.store.historyKey(e.LimitId, e.Id)))
				}
			}
			ops = append(ops, clientv3.OpDelete(string(kv.Key)))
		}
		for len(ops) > 0 {
			n := min(len(ops), max(1, a.opt.maxOps))
			if err := a.store.Commit(t.ctx, t.fence, ops[:n]); err != nil {
				return err
			}
			ops = ops[n:]
		}
		a.am.auditSwept.Add(float64(len(resp.Kvs)))
		if !resp.More {
			return nil
		}
	}
	return t.ctx.Err()
}

// sweepAuditLoop runs sweepAudit now and then every auditSweep until the
// term ends.
func (a *Allocator) sweepAuditLoop(t *term) {
	tick := time.NewTicker(a.opt.auditSweep)
	defer tick.Stop()
	for {
		if err := a.sweepAudit(t); err != nil && t.ctx.Err() == nil {
			a.log.Warn("allocator: audit retention sweep failed; retrying at the next sweep", "err", err)
		}
		select {
		case <-t.ctx.Done():
			return
		case <-tick.C:
		}
	}
}
