package main

import "flag"

// commandFlags registers each command's flags on a fresh flag set, as the
// command does: the docs' test holds every flag the documents name for a
// command against these. Every command of the table in main.go has one
// (a test checks it); history's are those of `history check`.
var commandFlags = map[string]func(*flag.FlagSet){
	"allocator": func(fs *flag.FlagSet) { (&allocatorConfig{}).register(fs) },
	"agent":     func(fs *flag.FlagSet) { (&agentConfig{}).register(fs) },
	"certs":     func(fs *flag.FlagSet) { (&certsConfig{}).register(fs) },
	"cluster":   func(fs *flag.FlagSet) { (&clusterConfig{}).register(fs) },
	"etcd":      func(fs *flag.FlagSet) { (&etcdConfig{}).register(fs) },
	"dev":       func(fs *flag.FlagSet) { (&devConfig{}).register(fs) },
	"gateway":   func(fs *flag.FlagSet) { (&gatewayConfig{}).register(fs) },
	"history":   func(fs *flag.FlagSet) { (&historyCheckConfig{}).register(fs) },
}
