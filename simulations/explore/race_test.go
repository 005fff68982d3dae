//go:build race

package explore

// raceBuild: the race detector slows exploration about tenfold, so the CI
// scopes run in a build without it (make test's second step).
const raceBuild = true
