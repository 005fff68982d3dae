package client

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "leasehold/proto/leasehold/v1"
)

// ErrSlotLost: a slot is no longer held (released, or expired because no
// heartbeat reached the agent in time, or the region's share of the limit
// ended): its holder must stop the work the slot covered.
var ErrSlotLost = errors.New("client: slot lost")

// SlotDecision is the agent's answer to AcquireSlot.
type SlotDecision struct {
	Allowed    bool
	Reason     pb.Reason // OK, OVER_LIMIT (all slots held), UNAVAILABLE (the agent cannot decide)
	RetryAfter time.Duration
	Limit      int64 // N, all regions together
	Held       int64 // the region's slots held after the call
	Slots      int64 // the region's share of N in force (0: none)
}

// Slot is one held slot of a concurrency limit. It heartbeats in the
// background (every third of its remaining life) until Release, until
// the context given to AcquireSlot ends (then it is released), or until
// it is lost. Its life is measured from when each call was sent, on the
// client's clock, minus a safety margin, so the client never believes it
// holds a slot the agent already freed. Safe for concurrent use.
type Slot struct {
	c         *Client
	limit, id string
	ttl       time.Duration

	mu       sync.Mutex // protects deadline, err
	deadline int64      // mono ns: the slot ends unless heartbeated
	err      error      // why it was lost (nil while held)

	lost     chan struct{} // closed when lost or released
	stop     chan struct{} // closed by Release
	stopOnce sync.Once
	done     chan struct{} // closed when the heartbeat loop ended
}

// AcquireSlot asks for one slot of a concurrency limit for holder (1-128
// characters of [A-Za-z0-9._-]; the same holder asking again gets its
// slot back), held for ttl between heartbeats (100ms..10m). A denial is
// a SlotDecision with a nil Slot, not an error; bad input is ErrInvalid,
// an unknown limit ErrUnknownLimit, an agent that did not answer
// ErrUnavailable. The slot heartbeats until Release or until ctx ends.
func (c *Client) AcquireSlot(ctx context.Context, limit, holder string, ttl time.Duration) (*Slot, SlotDecision, error) {
	if limit == "" || holder == "" || ttl <= 0 {
		return nil, SlotDecision{}, fmt.Errorf("%w: limit, holder and a ttl > 0 are required", ErrInvalid)
	}
	sent := c.mono()
	cctx, cancel := context.WithTimeout(ctx, c.opt.timeout+time.Second) // the agent may wait for the region's share
	resp, err := c.rpc.AcquireSlot(cctx, &pb.AcquireSlotRequest{LimitId: limit, HolderId: holder, Ttl: durationpb.New(ttl)})
	cancel()
	if err != nil {
		return nil, SlotDecision{Reason: pb.Reason_REASON_UNAVAILABLE}, wrapRPC("acquire slot", limit, err)
	}
	d := SlotDecision{Allowed: resp.Allowed, Reason: resp.Reason, RetryAfter: dur(resp.RetryAfter), Limit: resp.LimitSlots,
		Held: resp.Held, Slots: resp.Slots}
	if !resp.Allowed {
		return nil, d, nil
	}
	left := dur(resp.ExpiresIn)
	s := &Slot{c: c, limit: limit, id: resp.SlotId, ttl: ttl, deadline: sent + int64(left-c.slotMargin(left)),
		lost: make(chan struct{}), stop: make(chan struct{}), done: make(chan struct{})}
	go s.loop(ctx)
	return s, d, nil
}

// slotMargin is the safety margin of a slot life of d.
func (c *Client) slotMargin(d time.Duration) time.Duration {
	return c.opt.margin + time.Duration(float64(d)*c.opt.driftPPM/1e6)
}

// ID is the slot's id, as the agent names it.
func (s *Slot) ID() string { return s.id }

// Lost is closed when the slot is no longer held: released, or lost
// (Err says why).
func (s *Slot) Lost() <-chan struct{} { return s.lost }

// Err is why the slot was lost (wrapping ErrSlotLost), nil while held or
// after a Release.
func (s *Slot) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Deadline is when the slot ends unless heartbeated, on the local clock.
func (s *Slot) Deadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.c.base.Add(time.Duration(s.deadline))
}

// lose marks the slot lost with err (once).
func (s *Slot) lose(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
	s.stopOnce.Do(func() { close(s.stop) })
}

// loop heartbeats until the slot is released, lost, or ctx ends.
func (s *Slot) loop(ctx context.Context) {
	defer close(s.done)
	defer close(s.lost)
	for {
		s.mu.Lock()
		left := time.Duration(s.deadline - s.c.mono())
		s.mu.Unlock()
		if left <= 0 {
			s.lose(fmt.Errorf("%w: %s: no heartbeat answered before its end", ErrSlotLost, s.id))
			return
		}
		t := time.NewTimer(max(left/3, time.Millisecond))
		select {
		case <-s.stop:
			t.Stop()
			return
		case <-ctx.Done():
			t.Stop()
			rctx, cancel := context.WithTimeout(context.Background(), s.c.opt.timeout)
			_ = s.release(rctx)
			cancel()
			return
		case <-t.C:
		}
		if err := s.heartbeat(ctx); errors.Is(err, ErrSlotLost) {
			s.lose(err)
			return
		}
	}
}

// heartbeat extends the slot once.
func (s *Slot) heartbeat(ctx context.Context) error {
	sent := s.c.mono()
	cctx, cancel := context.WithTimeout(ctx, s.c.opt.timeout)
	resp, err := s.c.rpc.HeartbeatSlot(cctx, &pb.HeartbeatSlotRequest{LimitId: s.limit, SlotId: s.id, Ttl: durationpb.New(s.ttl)})
	cancel()
	if err != nil {
		if status.Code(err) == codes.NotFound && strings.HasPrefix(status.Convert(err).Message(), "slot_id") {
			return fmt.Errorf("%w: %s: %w", ErrSlotLost, s.id, err)
		}
		return wrapRPC("heartbeat slot", s.limit, err) // tried again at the next beat, while the slot lives
	}
	left := dur(resp.ExpiresIn)
	s.mu.Lock()
	s.deadline = max(s.deadline, sent+int64(left-s.c.slotMargin(left)))
	s.mu.Unlock()
	return nil
}

// Heartbeat extends the slot now (the background loop does it anyway):
// ErrSlotLost when it is no longer held.
func (s *Slot) Heartbeat(ctx context.Context) error {
	if err := s.Err(); err != nil {
		return err
	}
	err := s.heartbeat(ctx)
	if errors.Is(err, ErrSlotLost) {
		s.lose(err)
	}
	return err
}

// Release frees the slot and stops its heartbeats. Releasing twice, or a
// lost slot, is not an error.
func (s *Slot) Release(ctx context.Context) error {
	s.stopOnce.Do(func() { close(s.stop) })
	<-s.done
	if s.Err() != nil {
		return nil
	}
	return s.release(ctx)
}

func (s *Slot) release(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, s.c.opt.timeout)
	defer cancel()
	_, err := s.c.rpc.ReleaseSlot(cctx, &pb.ReleaseSlotRequest{LimitId: s.limit, SlotId: s.id})
	if err != nil {
		return wrapRPC("release slot", s.limit, err)
	}
	return nil
}
