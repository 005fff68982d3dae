package regionagent

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

func TestParseRedis(t *testing.T) {
	for _, tc := range []struct {
		spec string
		kind string // "", or the error expectation "err"
	}{
		{"127.0.0.1:6379", "*redis.Client"},
		{"redis://127.0.0.1:6379/2", "*redis.Client"},
		{"sentinel://mymaster@127.0.0.1:26379,127.0.0.1:26380", "*redis.Client"},
		{"cluster://127.0.0.1:7000,127.0.0.1:7001", "*redis.ClusterClient"},
		{"", "err"},
		{"localhost", "err"},
		{"a:1,b:2", "err"},
		{"sentinel://@h:1", "err"},
		{"sentinel://m", "err"},
		{"cluster://nohost", "err"},
		{"memcache://h:1", "err"},
	} {
		c, err := ParseRedis(tc.spec)
		if tc.kind == "err" {
			if err == nil {
				t.Errorf("%q: accepted", tc.spec)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.spec, err)
			continue
		}
		var got string
		var ctxTimeouts bool
		var maint *maintnotifications.Config
		switch c := c.(type) {
		case *redis.Client:
			got = "*redis.Client"
			ctxTimeouts, maint = c.Options().ContextTimeoutEnabled, c.Options().MaintNotificationsConfig
		case *redis.ClusterClient:
			got = "*redis.ClusterClient"
			ctxTimeouts, maint = c.Options().ContextTimeoutEnabled, c.Options().MaintNotificationsConfig
		}
		if !ctxTimeouts || maint == nil || maint.Mode != maintnotifications.ModeDisabled {
			t.Errorf("%q: ContextTimeoutEnabled %v, maintenance notifications %+v; want true and disabled", tc.spec, ctxTimeouts, maint)
		}
		if got != tc.kind {
			t.Errorf("%q: client %T, want %s", tc.spec, c, tc.kind)
		}
		c.Close()
	}
}
