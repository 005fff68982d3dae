package ports

import (
	"net"
	"testing"
)

// TestBelowEphemeralRange: the ports handed out are free and lie below
// the range the kernel numbers ":0" listeners from.
func TestBelowEphemeralRange(t *testing.T) {
	top := ephemeralStart()
	for range 20 {
		p, err := Free()
		if err != nil {
			t.Fatal(err)
		}
		if p >= top && top > 11000 {
			t.Fatalf("port %d is in the ephemeral range (from %d)", p, top)
		}
		l, err := net.Listen("tcp", Addr(t))
		if err != nil {
			t.Fatalf("Addr is not free: %v", err)
		}
		l.Close()
	}
}
