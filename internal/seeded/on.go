//go:build leasehold_seeded

package seeded

const enabled = true
