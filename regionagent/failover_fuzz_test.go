package regionagent

import (
	"errors"
	"testing"
	"time"
)

// FuzzParseReplInfo: the INFO parser never panics, fails only with
// errReplInfo, and what it accepts is usable: a master has an id, offsets
// are not negative, replica lags are whole seconds within a day (or -1,
// not given), and the
// history follower takes it without panicking.
func FuzzParseReplInfo(f *testing.F) {
	for _, s := range []string{infoPrimary, infoPromoted, infoReplica, "",
		"role:master\nmaster_replid:a\nmaster_repl_offset:0\nslave0:ip=,port=,state=online,offset=0,lag=99999999999\n",
		"role:master\r\nmaster_replid:a\r\nmaster_replid2:b\r\nmaster_repl_offset:9223372036854775807\r\nsecond_repl_offset:-1\r\n",
		"slave12:ip=1,port=2,state=x,offset=3\nrole:x\n", "role:master\nmaster_replid:" + noReplID + "\nmaster_repl_offset:1\n",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		info, err := parseReplInfo(s)
		if err != nil {
			if !errors.Is(err, errReplInfo) {
				t.Fatalf("error %v is not errReplInfo", err)
			}
			return
		}
		if info.Role == "" || info.Role == "master" && info.ReplID == "" {
			t.Fatalf("accepted %+v", info)
		}
		if info.Offset < 0 || info.SecondOffset < -1 {
			t.Fatalf("offsets %d, %d", info.Offset, info.SecondOffset)
		}
		for _, r := range info.Replicas {
			if r.Offset < 0 || r.Lag != -1 && (r.Lag < 0 || r.Lag > 24*time.Hour || r.Lag%time.Second != 0) {
				t.Fatalf("replica %+v", r)
			}
		}
		var st replState
		t0 := time.Unix(100, 0)
		st.observe(t0, "p", info)
		st.failed(t0.Add(time.Second), "p")
		if c, ok := st.observe(t0.Add(2*time.Second), "p", master("z", info.ReplID, 0, 1)); ok && c.Lag() < -1 {
			t.Fatalf("cut %+v", c)
		}
	})
}
