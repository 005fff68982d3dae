package regionagent

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// This file reads the text of INFO replication (Redis 5 and later) from a
// primary: the replication id, the offset, and what each replica
// acknowledged. The parser is pure and never panics (see the fuzz test).

// errReplInfo reports INFO replication text the watcher cannot use.
var errReplInfo = errors.New("regionagent: bad INFO replication")

// noReplID is master_replid2 when the node has no previous replication id.
const noReplID = "0000000000000000000000000000000000000000"

// replInfo is what INFO replication says about one node.
type replInfo struct {
	Role string // "master" or "slave"
	// ReplID is master_replid: the id of the replication history the node
	// is in. A primary keeps it until it is restarted (without the id in
	// its RDB) or a replica of it is promoted (the promoted one starts a
	// new id).
	ReplID string
	// ReplID2 is master_replid2: the previous id of a promoted replica
	// (its old primary's ReplID), "" when none.
	ReplID2 string
	// Offset is master_repl_offset: bytes of the replication stream so far.
	Offset int64
	// SecondOffset is second_repl_offset: after a promotion, 1 + the offset
	// up to which the node holds ReplID2's history; -1 when none.
	SecondOffset int64
	// Replicas are the slaveN lines of a primary.
	Replicas []replicaInfo
}

// replicaInfo is one "slaveN:ip=...,port=...,state=...,offset=...,lag=..."
// line of a primary.
type replicaInfo struct {
	Addr   string
	State  string // "online" once synced; wait_bgsave, send_bulk before
	Offset int64  // the replication offset the replica acknowledged
	// Lag is the time since the replica's last acknowledgement (replicas
	// acknowledge every second; whole seconds); -1 when not given.
	Lag time.Duration
}

// online reports whether the replica is synced and streaming.
func (r replicaInfo) online() bool { return r.State == "online" }

// parseReplInfo parses INFO replication (or a whole INFO reply: other
// sections are ignored). A master must name its replid and offset.
func parseReplInfo(s string) (replInfo, error) {
	info := replInfo{SecondOffset: -1}
	var haveID, haveOffset bool
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue // not a field line
		}
		var err error
		switch k {
		case "role":
			info.Role = v
		case "master_replid":
			if !validReplID(v) {
				return replInfo{}, fmt.Errorf("%w: master_replid %q", errReplInfo, v)
			}
			info.ReplID, haveID = v, true
		case "master_replid2":
			if v != noReplID && v != "" {
				if !validReplID(v) {
					return replInfo{}, fmt.Errorf("%w: master_replid2 %q", errReplInfo, v)
				}
				info.ReplID2 = v
			}
		case "master_repl_offset":
			info.Offset, err = nonNegInt(v)
			haveOffset = err == nil
		case "second_repl_offset":
			info.SecondOffset, err = strconv.ParseInt(v, 10, 64)
			if err == nil && info.SecondOffset < -1 {
				err = errors.New("below -1")
			}
		default:
			if strings.HasPrefix(k, "slave") && isDigits(k[len("slave"):]) {
				var r replicaInfo
				r, err = parseReplica(v)
				if err == nil {
					info.Replicas = append(info.Replicas, r)
				}
			}
		}
		if err != nil {
			return replInfo{}, fmt.Errorf("%w: %s: %v", errReplInfo, k, err)
		}
	}
	if info.Role == "" {
		return replInfo{}, fmt.Errorf("%w: no role", errReplInfo)
	}
	if info.Role == "master" && (!haveID || !haveOffset) {
		return replInfo{}, fmt.Errorf("%w: a master without master_replid or master_repl_offset", errReplInfo)
	}
	return info, nil
}

// parseReplica parses "ip=127.0.0.1,port=6380,state=online,offset=42,lag=0".
func parseReplica(v string) (replicaInfo, error) {
	r := replicaInfo{Lag: -1}
	var ip, port string
	haveOffset := false
	for _, kv := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(kv, "=")
		if !ok {
			return replicaInfo{}, fmt.Errorf("field %q", kv)
		}
		switch k {
		case "ip":
			ip = val
		case "port":
			port = val
		case "state":
			r.State = val
		case "offset":
			n, err := nonNegInt(val)
			if err != nil {
				return replicaInfo{}, fmt.Errorf("offset: %v", err)
			}
			r.Offset, haveOffset = n, true
		case "lag":
			n, err := nonNegInt(val)
			if err != nil {
				return replicaInfo{}, fmt.Errorf("lag: %v", err)
			}
			if n > int64(24*time.Hour/time.Second) {
				n = int64(24 * time.Hour / time.Second) // a day means "very behind"; no overflow
			}
			r.Lag = time.Duration(n) * time.Second
		}
	}
	if !haveOffset || r.State == "" {
		return replicaInfo{}, errors.New("replica without state or offset")
	}
	r.Addr = ip + ":" + port
	return r, nil
}

func nonNegInt(v string) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, err
	}
	if n < 0 {
		return 0, fmt.Errorf("negative %d", n)
	}
	return n, nil
}

// validReplID: Redis writes 40 hex digits; anything without separators is
// taken as is (the watcher only compares ids).
func validReplID(v string) bool {
	if v == "" || len(v) > 64 {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
