package httplimit_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	"leasehold/regionagent/client"
	"leasehold/regionagent/client/clienttest"
	"leasehold/regionagent/httplimit"
)

// Put a limit per tenant in front of a handler; the tenant is named by a
// header.
func ExampleMiddleware() {
	agent := clienttest.NewAgent(time.Now) // a fake region agent
	agent.SetLimit("tenant/atlas", 1, time.Hour, time.Hour)
	target, dialer, stop := agent.Listen()
	defer stop()
	c, err := client.New(target, client.WithDialOptions(dialer))
	if err != nil {
		panic(err)
	}
	defer c.Close(context.Background())

	limit := httplimit.Middleware(c,
		httplimit.Key(func(r *http.Request) (string, bool) {
			t := r.Header.Get("X-Tenant")
			return "tenant/" + t, t != ""
		}),
		httplimit.ShowRemaining(func(r *http.Request) bool { return r.Header.Get("Authorization") != "" }),
	)
	h := limit(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))

	for range 2 {
		req := httptest.NewRequest("GET", "/orders", nil)
		req.Header.Set("X-Tenant", "atlas")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("RateLimit-Policy"))
	}
	// Output:
	// 200 "tenant/atlas";q=1;w=3600
	// 429 "tenant/atlas";q=1;w=3600
}

// Behind a load balancer at 10.0.0.0/8, the client is the last address it
// appended to X-Forwarded-For; from anyone else the header is ignored.
func ExampleClientIP() {
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Forwarded-For", "6.6.6.6, 203.0.113.9")
	r.RemoteAddr = "10.1.2.3:5000"
	fmt.Println(httplimit.ClientIP(r, trusted))
	r.RemoteAddr = "198.51.100.4:5000"
	fmt.Println(httplimit.ClientIP(r, trusted))
	// Output:
	// 203.0.113.9
	// 198.51.100.4
}
