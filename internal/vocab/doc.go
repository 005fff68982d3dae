// Package vocab is Leasehold's shared vocabulary: the rules for limit ids,
// region names and request ids, the error that names a bad field, the
// gRPC metadata keys, and the bounds on identifiers.
//
// The allocator, the region agent, the Go client, the Envoy service and
// quotactl all speak it, so none of them has to import a server to check
// an id or read a trailer. It imports only the standard library (a test
// fails if that changes).
package vocab
