package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// counts are what the agent's decisions made other processes do, counted
// rather than timed: Redis commands run (INFO commandstats, every command
// but INFO itself) and leases the allocator granted
// (leasehold_lease_grants_total). Unlike CPU time, a count does not move
// with the machine's load, so it compares across noisy runs.
type counts struct {
	redisCmds int64
	grants    int64
	byCommand map[string]int64 // calls per Redis command
}

// counters reads counts from a redis-server and an allocator's metrics.
type counters struct {
	rdb        *redis.Client
	metricsURL string
	http       *http.Client
}

func newCounters(redisAddr, allocHTTP string) *counters {
	return &counters{
		rdb:        redis.NewClient(&redis.Options{Addr: redisAddr, PoolSize: 1}),
		metricsURL: "http://" + allocHTTP + "/metrics",
		http:       &http.Client{Timeout: 5 * time.Second},
	}
}

func (c *counters) close() { _ = c.rdb.Close() }

func (c *counters) read(ctx context.Context) (counts, error) {
	info, err := c.rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return counts{}, fmt.Errorf("redis INFO commandstats: %w", err)
	}
	cmds, byCommand, err := commandCalls(info)
	if err != nil {
		return counts{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.metricsURL, nil)
	if err != nil {
		return counts{}, err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return counts{}, fmt.Errorf("allocator metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return counts{}, fmt.Errorf("allocator metrics: %s", resp.Status)
	}
	grants, err := metricSum(resp.Body, "leasehold_lease_grants_total")
	if err != nil {
		return counts{}, fmt.Errorf("allocator metrics: %w", err)
	}
	return counts{redisCmds: cmds, grants: grants, byCommand: byCommand}, nil
}

// commandCalls sums the calls of every command in an INFO commandstats
// reply except INFO (the reads of these counts), and gives each one's.
func commandCalls(info string) (int64, map[string]int64, error) {
	var sum int64
	by := map[string]int64{}
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
			continue
		}
		for f := range strings.SplitSeq(rest, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return 0, nil, fmt.Errorf("INFO commandstats: %s: %w", name, err)
				}
				sum += n
				by[strings.TrimPrefix(name, "cmdstat_")] = n
			}
		}
	}
	return sum, by, nil
}

// topCommands is the Redis commands of a case, most called first, each
// per decision: "evalsha 0.412, hgetall 0.100" (at most n of them).
func topCommands(before, after map[string]int64, decisions, n int) string {
	type cmd struct {
		name  string
		calls int64
	}
	var cs []cmd
	for name, c := range after {
		if d := c - before[name]; d > 0 {
			cs = append(cs, cmd{name, d})
		}
	}
	sort.Slice(cs, func(i, j int) bool {
		if cs[i].calls != cs[j].calls {
			return cs[i].calls > cs[j].calls
		}
		return cs[i].name < cs[j].name
	})
	var parts []string
	for i, c := range cs {
		if i == n {
			break
		}
		parts = append(parts, c.name+" "+perDecision(c.calls, decisions))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// metricSum sums every sample of the counter name (all label sets) in a
// Prometheus text exposition.
func metricSum(r io.Reader, name string) (int64, error) {
	var sum float64
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(f) == 0 {
			return 0, fmt.Errorf("%s: no value in %q", name, line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", name, err)
		}
		sum += v
	}
	return int64(sum), sc.Err()
}
