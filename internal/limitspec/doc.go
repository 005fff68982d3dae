// Package limitspec is a limit as the protocol carries it (pb.Limit): the
// checks a limit must pass before an allocator stores it, the defaults it
// then gets, the names quotactl and limits files give its mode and
// fallbacks, and the bound on one ApplyLimits call.
//
// The allocator enforces these rules; quotactl checks a limits file
// against the same rules before it sends anything. It imports the
// generated protobuf package and leasehold/internal/vocab, never etcd nor
// a server, so a client can link it cheaply.
package limitspec
