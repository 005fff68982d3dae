package regionagent

import (
	"fmt"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"
)

// ParseRedis turns a --redis value into a client:
//
//	HOST:PORT                         a standalone server
//	redis://[user:pass@]HOST:PORT/DB  a standalone server, by URL
//	sentinel://MASTER@H1:P1,H2:P2     Sentinel: the named master's primary
//	cluster://H1:P1,H2:P2             Redis Cluster (keys are hash-tagged by limit)
func ParseRedis(spec string) (redis.UniversalClient, error) {
	switch {
	case spec == "":
		return nil, fmt.Errorf("redis: empty address")
	case strings.HasPrefix(spec, "redis://"), strings.HasPrefix(spec, "rediss://"):
		o, err := redis.ParseURL(spec)
		if err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
		return redis.NewClient(o), nil
	case strings.HasPrefix(spec, "sentinel://"):
		rest := strings.TrimPrefix(spec, "sentinel://")
		master, hosts, ok := strings.Cut(rest, "@")
		if !ok || master == "" {
			return nil, fmt.Errorf("redis: %q: want sentinel://MASTER@HOST:PORT[,HOST:PORT...]", spec)
		}
		addrs, err := hostPorts(hosts)
		if err != nil {
			return nil, err
		}
		return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: master, SentinelAddrs: addrs}), nil
	case strings.HasPrefix(spec, "cluster://"):
		addrs, err := hostPorts(strings.TrimPrefix(spec, "cluster://"))
		if err != nil {
			return nil, err
		}
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs}), nil
	case strings.Contains(spec, "://"):
		return nil, fmt.Errorf("redis: %q: unknown scheme (use HOST:PORT, redis://, sentinel:// or cluster://)", spec)
	}
	addrs, err := hostPorts(spec)
	if err != nil {
		return nil, err
	}
	if len(addrs) != 1 {
		return nil, fmt.Errorf("redis: %q: several addresses need sentinel:// or cluster://", spec)
	}
	return redis.NewClient(&redis.Options{Addr: addrs[0]}), nil
}

func hostPorts(s string) ([]string, error) {
	var out []string
	for _, hp := range strings.Split(s, ",") {
		if _, _, err := net.SplitHostPort(hp); err != nil {
			return nil, fmt.Errorf("redis: %q: want HOST:PORT", hp)
		}
		out = append(out, hp)
	}
	return out, nil
}
