package bucket_test

import (
	"fmt"
	"time"

	"leasehold/regionagent/bucket"
)

func ExampleKey() {
	fmt.Println(bucket.Key("", "tenant/atlas", 28_333_333))
	fmt.Println(bucket.LockKey("", "tenant/atlas"))
	// Output:
	// lh:{tenant/atlas}:w:28333333
	// lh:{tenant/atlas}:renew
}

// An agent asked Redis for TIME; the reply took 2 ms. A lease granted with
// expires_in 10 s, measured from when the grant request was sent minus a
// 50 ms margin, becomes a Redis deadline no later than the agent's.
func ExampleClockSync() {
	sent := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC) // agent clock
	received := sent.Add(2 * time.Millisecond)
	redisSaid := time.UnixMilli(1_764_417_600_000).Add(500 * time.Microsecond)
	c, err := bucket.NewClockSync(sent, received, redisSaid)
	if err != nil {
		panic(err)
	}
	grantSent := received.Add(time.Second)
	agentDeadline := grantSent.Add(10*time.Second - 50*time.Millisecond)
	fmt.Println("rtt:", c.RTT())
	fmt.Println("deadline on Redis:", c.ToRedis(agentDeadline))
	fmt.Println("start on Redis:", c.ToRedisStart(grantSent))
	// Output:
	// rtt: 2ms
	// deadline on Redis: 1764417610950
	// start on Redis: 1764417601003
}
