package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"leasehold/internal/bounds"
	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
)

// globals are the flags every command accepts.
type globals struct {
	addr    string        // --allocator
	timeout time.Duration // --timeout: each RPC, connecting included
	json    bool          // --json
	sec     security      // --tls-*, --token, --token-file
}

func defaultGlobals() globals {
	return globals{addr: "127.0.0.1:7400", timeout: 5 * time.Second}
}

// register declares the global flags on f, bound to g. Values already set
// (at an outer level of the command line) are kept.
func (g *globals) register(f *flagSet) {
	f.value("allocator", "`ADDR`: host:port of an allocator replica; a follower redirects to the leader (default 127.0.0.1:7400)", func(s string) error {
		if err := checkAddr(s); err != nil {
			return err
		}
		g.addr = s
		return nil
	})
	f.value("timeout", "`DUR`: time allowed for each request, connecting included (default 5s)", func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			return errors.New("want a positive duration with a unit, such as 500ms or 5s")
		}
		g.timeout = d
		return nil
	})
	f.boolVar(&g.json, "json", "print machine-readable JSON on stdout")
	g.sec.register(f)
}

// checkAddr rejects addresses that cannot name an allocator.
func checkAddr(s string) error {
	switch {
	case s == "":
		return errors.New("want host:port")
	case len(s) > 512:
		return errors.New("address too long")
	case strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0:
		return errors.New("want host:port without spaces")
	}
	return nil
}

// env is one invocation's state: global settings, output, connections.
type env struct {
	globals
	path   string // the command path for messages, e.g. "limits set"
	stdout io.Writer
	conns  map[string]*grpc.ClientConn // by address; closed by close
	dial   []grpc.DialOption           // built from globals.sec on first use
	groups groupState                  // the allocator groups' map, read once (groups.go)
	// planGroups, when set, is the "groups" row printLimit adds: each
	// group's version of a plan (plans_groups.go).
	planGroups string
	// planGroupRows, when set, adds a GROUPS column to plans list.
	planGroupRows map[string]string
}

func newEnv(stdout io.Writer) *env {
	return &env{globals: defaultGlobals(), stdout: stdout, conns: map[string]*grpc.ClientConn{}}
}

func (e *env) close() {
	for _, c := range e.conns {
		_ = c.Close()
	}
}

// conn returns a client connection to addr. grpc.NewClient connects lazily:
// the first RPC connects, within that RPC's deadline.
func (e *env) conn(addr string) (*grpc.ClientConn, error) {
	if c, ok := e.conns[addr]; ok {
		return c, nil
	}
	if e.dial == nil {
		opts, err := e.sec.dialOptions(true)
		if err != nil {
			return nil, err
		}
		// A page of limits may be as large as the allocator sends.
		e.dial = append(opts, grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(bounds.AllocatorMaxSend)))
	}
	c, err := grpc.NewClient(addr, e.dial...)
	if err != nil {
		return nil, fmt.Errorf("allocator address %q: %v", addr, err)
	}
	e.conns[addr] = c
	return c, nil
}

// adminRPC is one Admin call; it must pass opt to the client method.
type adminRPC func(ctx context.Context, c pb.AdminClient, opt grpc.CallOption) error

// admin runs rpc against the allocator with the --timeout deadline. If the
// replica answers UNAVAILABLE naming another replica as leader, it retries
// once there (a follower refused, so nothing was written), and later calls
// of this invocation go straight to that leader. The error it returns is
// worded for the user.
//
// With allocator groups, a limit is read and written where it lives: an
// allocator of another group answers FAILED_PRECONDITION naming the
// group the limit lives in and one of its allocators, and the call is
// made there (once; this invocation's later calls still start at
// --allocator, since they may be about limits of other groups).
func (e *env) admin(ctx context.Context, rpc adminRPC) error {
	return e.adminAt(ctx, e.addr, true, rpc)
}

// adminAt is admin against addr; follow says whether a group's refusal is
// followed to the group named, and the first address is kept for later
// calls.
func (e *env) adminAt(ctx context.Context, addr string, follow bool, rpc adminRPC) error {
	via := ""
	leaderHops, groupHops := 0, 0
	for {
		var trailer metadata.MD
		err := e.once(ctx, addr, rpc, &trailer)
		if err == nil {
			if groupHops == 0 && addr != e.addr && follow {
				e.addr = addr
			}
			return nil
		}
		if leader := redirectTarget(err, trailer, addr); leaderHops == 0 && leader != "" {
			addr, via = leader, "leader named by "+addr
			leaderHops++
			continue
		}
		if group, owner := groupTarget(err, trailer, addr); follow && groupHops == 0 && owner != "" {
			addr, via = owner, "allocator group "+group+", named by "+addr
			groupHops, leaderHops = groupHops+1, 0
			continue
		}
		return e.describe(ctx, err, addr, via)
	}
}

// groupTarget returns the group and allocator an allocator of another
// group named, or "" when err is not such a refusal.
func groupTarget(err error, trailer metadata.MD, addr string) (group, owner string) {
	if status.Code(err) != codes.FailedPrecondition {
		return "", ""
	}
	g, a := trailer.Get(vocab.GroupMetadataKey), trailer.Get(vocab.GroupAllocatorMetadataKey)
	if len(g) == 0 || len(a) == 0 || a[0] == addr || checkAddr(a[0]) != nil {
		return "", ""
	}
	return vocab.Cap(g[0], 64), a[0]
}

func (e *env) once(ctx context.Context, addr string, rpc adminRPC, trailer *metadata.MD) error {
	c, err := e.conn(addr)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	return rpc(ctx, pb.NewAdminClient(c), grpc.Trailer(trailer))
}

// redirectTarget returns the leader a follower named, or "" when err is not
// such a refusal or names nothing usable.
func redirectTarget(err error, trailer metadata.MD, addr string) string {
	if status.Code(err) != codes.Unavailable {
		return ""
	}
	v := trailer.Get(vocab.LeaderMetadataKey)
	if len(v) == 0 || v[0] == addr || checkAddr(v[0]) != nil {
		return ""
	}
	return v[0]
}

// describe words an RPC error for the user, in one line. The allocator's
// own words are kept where they name a field or a version.
func (e *env) describe(ctx context.Context, err error, addr, via string) error {
	where := "allocator " + addr
	if via != "" {
		where += " (" + via + ")"
	}
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: %v", ctx.Err())
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := st.Message()
	switch st.Code() {
	case codes.InvalidArgument, codes.NotFound, codes.Aborted, codes.AlreadyExists,
		codes.FailedPrecondition, codes.OutOfRange:
		return errors.New(msg)
	case codes.Unavailable:
		if !e.sec.on() && strings.Contains(msg, "server preface") {
			msg += " (does it serve TLS? give --tls-ca)"
		}
		return fmt.Errorf("%s unavailable: %s", where, msg)
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: no answer within --timeout %v: %s", where, e.timeout, msg)
	case codes.Unimplemented:
		return fmt.Errorf("%s does not serve this request (older allocator?): %s", where, msg)
	case codes.Unauthenticated:
		return fmt.Errorf("%s: not authenticated (give --token, --token-file, LEASEHOLD_TOKEN or --tls-cert): %s", where, msg)
	case codes.PermissionDenied:
		if !strings.HasPrefix(msg, "permission denied") {
			msg = "permission denied: " + msg
		}
		return fmt.Errorf("%s: %s", where, msg)
	}
	return fmt.Errorf("%s: %s: %s", where, st.Code(), msg)
}
