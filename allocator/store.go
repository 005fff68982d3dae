package allocator

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"leasehold/internal/seeded"
	pb "leasehold/proto/leasehold/v1"
)

// Store keeps the allocator's records in etcd under a prefix:
//
//	<prefix>limits/<limit id>                              a Limit (protobuf)
//	<prefix>meta/limits-rev                                touched by every limit change
//	<prefix>grants/<limit id>!<window, 20 digits>/<region>/<request id>   a Grant (JSON)
//	<prefix>usage/<limit id>!<window, 20 digits>/<region>/<reporter>       a Usage (JSON)
//	<prefix>windows/<limit id>!<window, 20 digits>                          a closed window's summary (JSON)
//	<prefix>audit/<record id>                              the audit log (see audit.go)
//	<prefix>history/<limit id>!<event id>                  each limit's applied changes
//	<prefix>leader/                                        election keys
//
// "!" cannot occur in a limit id, so one limit's keys never share a prefix
// with another's. Safe for concurrent use.
type Store struct {
	cli    *clientv3.Client
	prefix string
}

// NewStore returns a store of records under prefix (e.g. "/leasehold/").
func NewStore(cli *clientv3.Client, prefix string) *Store {
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	return &Store{cli: cli, prefix: prefix}
}

// Client returns the etcd client.
func (s *Store) Client() *clientv3.Client { return s.cli }

func (s *Store) limitKey(id string) string    { return s.prefix + "limits/" + id }
func (s *Store) limitsPrefix() string         { return s.prefix + "limits/" }
func (s *Store) limitsRevKey() string         { return s.prefix + "meta/limits-rev" }
func (s *Store) grantsPrefix() string         { return s.prefix + "grants/" }
func (s *Store) usagePrefix() string          { return s.prefix + "usage/" }
func (s *Store) electionPrefix() string       { return s.prefix + "leader/" }
func windowPart(limit string, w int64) string { return fmt.Sprintf("%s!%020d/", limit, w) }

// sharesPrefix holds the rate shares of bucket limits, one key per share:
// shares/<limit>!/<region>/<request id> (the request id is unique within the region).
func (s *Store) sharesPrefix() string { return s.prefix + "shares/" }

func (s *Store) shareKey(g *ShareGrant) string {
	return s.sharesPrefix() + g.Limit + "!/" + g.Region + "/" + g.RequestID
}

// putShareOp returns the write of a rate share record.
func (s *Store) putShareOp(g *ShareGrant) (clientv3.Op, error) {
	b, err := json.Marshal(g)
	if err != nil {
		return clientv3.Op{}, err
	}
	return clientv3.OpPut(s.shareKey(g), string(b)), nil
}

func (s *Store) grantKey(g *Grant) string {
	return s.grantsPrefix() + windowPart(g.Limit, g.Window) + g.Region + "/" + g.RequestID
}

func (s *Store) usageKey(u *UsageRecord) string {
	return s.usagePrefix() + windowPart(u.Limit, u.Window) + u.Region + "/" + u.Reporter
}

// Fence guards a write: it commits only while the election key that made
// this replica leader still exists with the same create revision.
type Fence struct {
	Key string
	Rev int64
}

// Cmp is the fence as an etcd compare: every commit of a term is a
// transaction If(Cmp()). (The protocol explorer evaluates the same compare
// against its model of etcd.)
func (f Fence) Cmp() clientv3.Cmp {
	if seeded.On(seeded.NoFence) {
		return clientv3.Compare(clientv3.CreateRevision(f.Key), ">", -1) // holds for any key: no fence
	}
	return clientv3.Compare(clientv3.CreateRevision(f.Key), "=", f.Rev)
}

// putGrantOp returns the write of a grant record.
func (s *Store) putGrantOp(g *Grant) (clientv3.Op, error) {
	b, err := json.Marshal(g)
	if err != nil {
		return clientv3.Op{}, err
	}
	return clientv3.OpPut(s.grantKey(g), string(b)), nil
}

func (s *Store) putUsageOp(u *UsageRecord) (clientv3.Op, error) {
	b, err := json.Marshal(u)
	if err != nil {
		return clientv3.Op{}, err
	}
	return clientv3.OpPut(s.usageKey(u), string(b)), nil
}

// deleteWindowOps removes every record of one (limit, window).
func (s *Store) deleteWindowOps(k windowKey) []clientv3.Op {
	return []clientv3.Op{
		clientv3.OpDelete(s.grantsPrefix()+windowPart(k.limit, k.index), clientv3.WithPrefix()),
		clientv3.OpDelete(s.usagePrefix()+windowPart(k.limit, k.index), clientv3.WithPrefix()),
	}
}

// putSummaryOp writes a closed window's summary.
func (s *Store) putSummaryOp(w *WindowSummary) (clientv3.Op, error) {
	b, err := json.Marshal(w)
	if err != nil {
		return clientv3.Op{}, err
	}
	return clientv3.OpPut(s.summaryKey(w.Limit, w.Window), string(b)), nil
}

// Commit applies ops in one transaction, only if the fence holds. It returns
// ErrFenced when leadership was lost: nothing was written.
func (s *Store) Commit(ctx context.Context, f Fence, ops []clientv3.Op) error {
	resp, err := s.cli.Txn(ctx).If(f.Cmp()).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("allocator: commit %d ops: %w", len(ops), err)
	}
	if !resp.Succeeded {
		return ErrFenced
	}
	return nil
}

// onceKey marks batch seq of the term fenced by f as committed by a retry
// (CommitBatch). The term's batches are the only writers; a new term
// clears the prefix (ClearOnce).
func (s *Store) onceKey(f Fence, seq uint64) string {
	return s.prefix + "once/" + strconv.FormatInt(f.Rev, 10) + "/" + strconv.FormatUint(seq, 10)
}

// CommitBatch commits ops, batch seq of the term fenced by f, at most once
// in effect: the transaction applies only while no retry of the same batch
// has marked it committed. A retry (mark) writes the mark with the batch.
// So a copy of the batch that lands late (an attempt that timed out, a
// hedged copy still in flight when another committed) does nothing once a
// marked copy has committed, and cannot put back records that later
// batches overwrote. A first attempt (mark false) writes no mark: the
// normal path costs one compare. A copy refused because the batch is
// marked committed returns nil; one refused by the fence, ErrFenced.
func (s *Store) CommitBatch(ctx context.Context, f Fence, seq uint64, ops []clientv3.Op, mark bool) error {
	once := s.onceKey(f, seq)
	then := ops
	if mark {
		then = append(ops[:len(ops):len(ops)], clientv3.OpPut(once, ""))
	}
	resp, err := s.cli.Txn(ctx).
		If(f.Cmp(), clientv3.Compare(clientv3.CreateRevision(once), "=", 0)).
		Then(then...).
		Else(clientv3.OpGet(once, clientv3.WithCountOnly())).
		Commit()
	if err != nil {
		return fmt.Errorf("allocator: commit %d ops: %w", len(ops), err)
	}
	if !resp.Succeeded {
		if r := resp.Responses; len(r) == 1 && r[0].GetResponseRange().GetCount() > 0 {
			return nil // a retry of this batch committed it
		}
		return ErrFenced
	}
	return nil
}

// ClearOnce deletes the marks of earlier terms' retried batches (their
// copies are fenced anyway).
func (s *Store) ClearOnce(ctx context.Context) error {
	_, err := s.cli.Delete(ctx, s.prefix+"once/", clientv3.WithPrefix())
	return err
}

// State is everything a new leader loads before it serves.
type State struct {
	Revision  int64
	Limits    []*pb.Limit
	Grants    []*Grant
	Shares    []*ShareGrant
	Usage     []*UsageRecord
	Summaries []*WindowSummary
}

// Load reads limits, grants, rate shares and usage at one revision, page
// by page.
func (s *Store) Load(ctx context.Context) (*State, error) {
	st := &State{}
	rev, err := s.scan(ctx, s.limitsPrefix(), 0, func(k, v []byte) error {
		l := &pb.Limit{}
		if err := proto.Unmarshal(v, l); err != nil {
			return fmt.Errorf("limit %s: %w", k, err)
		}
		st.Limits = append(st.Limits, l)
		return nil
	})
	if err != nil {
		return nil, err
	}
	st.Revision = rev
	if _, err := s.scan(ctx, s.grantsPrefix(), rev, func(k, v []byte) error {
		g := &Grant{}
		if err := json.Unmarshal(v, g); err != nil {
			return fmt.Errorf("grant %s: %w", k, err)
		}
		st.Grants = append(st.Grants, g)
		return nil
	}); err != nil {
		return nil, err
	}
	if _, err := s.scan(ctx, s.sharesPrefix(), rev, func(k, v []byte) error {
		g := &ShareGrant{}
		if err := json.Unmarshal(v, g); err != nil {
			return fmt.Errorf("share %s: %w", k, err)
		}
		st.Shares = append(st.Shares, g)
		return nil
	}); err != nil {
		return nil, err
	}
	if _, err := s.scan(ctx, s.usagePrefix(), rev, func(k, v []byte) error {
		u := &UsageRecord{}
		if err := json.Unmarshal(v, u); err != nil {
			return fmt.Errorf("usage %s: %w", k, err)
		}
		st.Usage = append(st.Usage, u)
		return nil
	}); err != nil {
		return nil, err
	}
	if _, err := s.scan(ctx, s.summariesPrefix(), rev, func(k, v []byte) error {
		w := &WindowSummary{}
		if err := json.Unmarshal(v, w); err != nil {
			return fmt.Errorf("window summary %s: %w", k, err)
		}
		st.Summaries = append(st.Summaries, w)
		return nil
	}); err != nil {
		return nil, err
	}
	return st, nil
}

// scan reads every key under prefix at revision rev (0: the latest, whose
// revision it returns), 1000 keys a page.
func (s *Store) scan(ctx context.Context, prefix string, rev int64, fn func(k, v []byte) error) (int64, error) {
	const page = 1000
	key := prefix
	end := clientv3.GetPrefixRangeEnd(prefix)
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(page)}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.cli.Get(ctx, key, opts...)
		if err != nil {
			return 0, fmt.Errorf("allocator: load %s: %w", prefix, err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			if err := fn(kv.Key, kv.Value); err != nil {
				return 0, fmt.Errorf("allocator: load: %w", err)
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return rev, nil
		}
		key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// GetLimit reads one limit.
func (s *Store) GetLimit(ctx context.Context, id string) (*pb.Limit, error) {
	resp, err := s.cli.Get(ctx, s.limitKey(id))
	if err != nil {
		return nil, fmt.Errorf("allocator: get limit: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("%w: limit %q", ErrNotFound, id)
	}
	l := &pb.Limit{}
	if err := proto.Unmarshal(resp.Kvs[0].Value, l); err != nil {
		return nil, fmt.Errorf("allocator: decode limit %q: %w", id, err)
	}
	return l, nil
}

// ListLimits returns limits whose id starts with prefix, in id order, from
// after the page token (the last id of the previous page).
func (s *Store) ListLimits(ctx context.Context, prefix string, size int, token string) ([]*pb.Limit, string, error) {
	from := s.limitKey(prefix)
	end := clientv3.GetPrefixRangeEnd(from)
	if token != "" {
		if !strings.HasPrefix(token, prefix) {
			return nil, "", fieldErr("page_token", "does not belong to prefix %q", prefix)
		}
		from = s.limitKey(token) + "\x00"
	}
	resp, err := s.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(int64(size)))
	if err != nil {
		return nil, "", fmt.Errorf("allocator: list limits: %w", err)
	}
	out := make([]*pb.Limit, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		l := &pb.Limit{}
		if err := proto.Unmarshal(kv.Value, l); err != nil {
			return nil, "", fmt.Errorf("allocator: decode %s: %w", kv.Key, err)
		}
		out = append(out, l)
	}
	next := ""
	if resp.More && len(out) > 0 {
		next = out[len(out)-1].Id
	}
	return out, next, nil
}

// LimitsRevision returns the revision of the last limit change (0: none).
func (s *Store) LimitsRevision(ctx context.Context) (int64, error) {
	resp, err := s.cli.Get(ctx, s.limitsRevKey())
	if err != nil {
		return 0, fmt.Errorf("allocator: limits revision: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	return resp.Kvs[0].ModRevision, nil
}

// AllLimits reads every limit.
func (s *Store) AllLimits(ctx context.Context) ([]*pb.Limit, error) {
	var out []*pb.Limit
	_, err := s.scan(ctx, s.limitsPrefix(), 0, func(k, v []byte) error {
		l := &pb.Limit{}
		if err := proto.Unmarshal(v, l); err != nil {
			return fmt.Errorf("limit %s: %w", k, err)
		}
		out = append(out, l)
		return nil
	})
	return out, err
}

// decodeLimitEvent decodes a watched limit value.
func decodeLimitEvent(v []byte) (*pb.Limit, error) {
	l := &pb.Limit{}
	if err := proto.Unmarshal(v, l); err != nil {
		return nil, err
	}
	return l, nil
}
