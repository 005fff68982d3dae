package regionagent

import (
	"crypto/tls"
	"fmt"
	"net"
	"strings"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// ParseRedis turns a --redis value into a client:
//
//	HOST:PORT                         a standalone server
//	redis://[user:pass@]HOST:PORT/DB  a standalone server, by URL
//	sentinel://MASTER@H1:P1,H2:P2     Sentinel: the named master's primary
//	cluster://H1:P1,H2:P2             Redis Cluster (keys are hash-tagged by limit)
//
// Every client respects its calls' context deadlines on the socket too
// (ContextTimeoutEnabled): the agent's short per-call timeout then bounds a
// call to a Redis that accepts connections and never answers, instead of
// go-redis's 3 s read timeout per attempt. And none takes part in
// go-redis's maintenance notifications (its default "auto" mode asks every
// new connection for them, and relaxes a connection's timeouts while the
// server announces a migration): the agent bounds every call itself, and
// a Redis that moves a slot answers MOVED/ASK, which every client follows.
func ParseRedis(spec string) (redis.UniversalClient, error) { return ParseRedisTLS(spec, nil) }

// ParseRedisTLS is ParseRedis with the TLS configuration of rediss://
// URLs: cfg's RootCAs (and client certificate, if any) with the URL's host
// as the server name. A nil cfg trusts the system's roots.
func ParseRedisTLS(spec string, cfg *tls.Config) (redis.UniversalClient, error) {
	switch {
	case spec == "":
		return nil, fmt.Errorf("redis: empty address")
	case strings.HasPrefix(spec, "redis://"), strings.HasPrefix(spec, "rediss://"):
		o, err := redis.ParseURL(spec)
		if err != nil {
			return nil, fmt.Errorf("redis: %w", err)
		}
		if o.TLSConfig != nil && cfg != nil {
			c := cfg.Clone()
			c.ServerName = o.TLSConfig.ServerName
			o.TLSConfig = c
		}
		o.ContextTimeoutEnabled, o.MaintNotificationsConfig = true, noMaint()
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
		return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: master, SentinelAddrs: addrs,
			ContextTimeoutEnabled: true}), nil // (go-redis turns maintenance notifications off for Sentinel)
	case strings.HasPrefix(spec, "cluster://"):
		addrs, err := hostPorts(strings.TrimPrefix(spec, "cluster://"))
		if err != nil {
			return nil, err
		}
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true,
			MaintNotificationsConfig: noMaint()}), nil
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
	return redis.NewClient(&redis.Options{Addr: addrs[0], ContextTimeoutEnabled: true, MaintNotificationsConfig: noMaint()}), nil
}

// noMaint turns go-redis's maintenance notifications off (see ParseRedis).
func noMaint() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
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
