package main

import (
	"strings"
	"testing"
)

// A package that timed out: the summary names the running test and shows
// the goroutine blocked in this module's test code, not etcd's.
func TestSummaryOfATimeout(t *testing.T) {
	in := `=== RUN   TestA
--- PASS: TestA (0.10s)
panic: test timed out after 25m0s
	running tests:
		TestRedisCluster (24m1s)

goroutine 5218 [select, 24 minutes]:
go.etcd.io/etcd/server/v3/etcdserver.(*EtcdServer).run(0xc0009da708)
	/root/go/pkg/mod/go.etcd.io/etcd/server/v3@v3.7.3/etcdserver/server.go:842 +0xb6f

goroutine 77 [chan receive, 24 minutes]:
leasehold/regionagent.TestRedisCluster(0xc000123)
	/work/main/regionagent/cluster_test.go:194 +0x1a5
testing.tRunner(0xc000123, 0x1)
	/usr/local/go/src/testing/testing.go:1934 +0xea

FAIL	leasehold/regionagent	1500.115s
ok  	leasehold/regionagent/bucket	9.577s
--- FAIL: TestOther (1.00s)
`
	var b strings.Builder
	if err := summarize(strings.NewReader(in), &b); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	for _, want := range []string{"panic: test timed out", "TestRedisCluster (24m1s)", "cluster_test.go:194", "FAIL\tleasehold/regionagent", "--- FAIL: TestOther"} {
		if !strings.Contains(got, want) {
			t.Errorf("summary lacks %q:\n%s", want, got)
		}
	}
	for _, not := range []string{"etcdserver", "TestA", "bucket"} {
		if strings.Contains(got, not) {
			t.Errorf("summary has %q:\n%s", not, got)
		}
	}
}

// A passing run has nothing to summarize.
func TestSummaryOfAPass(t *testing.T) {
	var b strings.Builder
	if err := summarize(strings.NewReader("ok  \tleasehold/x\t1.0s\n--- PASS: TestA (0.1s)\n"), &b); err != nil {
		t.Fatal(err)
	}
	if b.Len() != 0 {
		t.Fatalf("summary of a pass: %q", b.String())
	}
}
