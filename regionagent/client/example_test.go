package client_test

import (
	"context"
	"fmt"
	"time"

	"leasehold/regionagent/client"
	"leasehold/regionagent/client/clienttest"
)

// A limit of 2 per minute: two requests pass, the third is denied by the
// agent, the fourth by the denial cache without asking.
func Example() {
	clock := clienttest.NewClock(time.Unix(1_700_000_080, 0))
	agent := clienttest.NewAgent(clock.Now) // a fake region agent
	agent.SetLimit("tenant/atlas", 2, time.Minute, 15*time.Second)
	target, dialer, stop := agent.Listen()
	defer stop()

	c, err := client.New(target, client.WithDialOptions(dialer), client.WithClock(clock.Now))
	if err != nil {
		panic(err)
	}
	defer c.Close(context.Background())
	for range 4 {
		d, err := c.Allow(context.Background(), "tenant/atlas", 1)
		if err != nil {
			panic(err)
		}
		fmt.Println(d.Allowed, d.Reason, d.Source, d.RetryAfter)
	}
	// Output:
	// true REASON_OK agent 0s
	// true REASON_OK agent 0s
	// false REASON_OVER_LIMIT agent 20s
	// false REASON_OVER_LIMIT denial-cache 20s
}
