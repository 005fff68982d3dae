package regionagent

import (
	"testing"
	"time"
)

// TestTrackerWaitFor: waitFor returns false while work is in flight past
// its bound (Close then does not hang on a call that never ends), and true
// once the work is done, including work that ends while it waits.
func TestTrackerWaitFor(t *testing.T) {
	var tr tracker
	if !tr.waitFor(time.Millisecond) {
		t.Fatal("waitFor with nothing in flight = false")
	}
	tr.add()
	if tr.waitFor(10 * time.Millisecond) {
		t.Fatal("waitFor with work in flight = true")
	}
	started := make(chan struct{})
	res := make(chan bool)
	go func() { close(started); res <- tr.waitFor(time.Minute) }()
	<-started
	tr.done()
	if !<-res {
		t.Fatal("waitFor did not see the work end")
	}
}
