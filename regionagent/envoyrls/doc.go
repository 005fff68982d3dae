// Package envoyrls serves Envoy's rate limit service API
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) from the
// region agent, so Envoy (and other gateways speaking that API) can use
// Leasehold limits without a client library.
//
// A YAML mapping (Load, docs/envoy.md) maps a request's domain and each
// descriptor's entries to a limit id template such as "tenant/{tenant_id}".
// The descriptors that map to limits are decided together with one
// CheckMulti (all are charged or none; on Redis Cluster their limits must
// share a hash tag, else the call is INVALID_ARGUMENT); hits_addend is the
// cost. A descriptor that maps to no limit is allowed, not charged, and
// counted in leasehold_envoy_unmapped_descriptors_total. When the agent cannot decide
// (a limit fails closed with no lease, Redis down), the call fails with
// gRPC UNAVAILABLE so the gateway's own failure mode applies.
//
// Watch reloads the mapping on change; a file that does not validate is
// refused (logged with line and reason) and the mapping in force stays.
package envoyrls
