package regionagent

import (
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
)

// watchReady follows cc's connectivity until it shuts down. Each time the
// connection becomes READY after it was not (the allocator or the link to
// it came back), it lets the breaker probe at once rather than at the end
// of its cooldown, and asks the agent to sync now (reconnected): the sync
// is the probe, so a healed allocator is known as soon as gRPC reaches it.
func (c *allocClient) watchReady(cc *grpc.ClientConn) {
	st := cc.GetState()
	for st != connectivity.Shutdown && cc.WaitForStateChange(c.watchCtx, st) {
		prev := st
		st = cc.GetState()
		if st == connectivity.Ready && prev != connectivity.Ready {
			c.br.probeNow(c.now())
			select {
			case c.reconnected <- struct{}{}:
			default: // a sync is already asked for
			}
		}
	}
}

// probeNow ends an open breaker's cooldown: the next call probes.
func (b *breaker) probeNow(now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failures >= breakerTrip && now.Before(b.openUntil) {
		b.openUntil = now
	}
}
