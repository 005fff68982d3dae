package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/protobuf/types/known/durationpb"

	"leasehold/allocator"
	"leasehold/internal/bounds"
	"leasehold/internal/groupmap"
	"leasehold/internal/history"
	"leasehold/lease"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent"
)

// devConfig is everything `leasehold dev` takes.
type devConfig struct {
	dataDir              string
	allocGRPC, allocHTTP string
	etcdClient, etcdPeer string
	euGRPC, euHTTP       string
	usGRPC, usHTTP       string
	euGateway, usGateway string
	euGatewayMetrics     string
	usGatewayMetrics     string
	redis                string
	noDemo               bool
	traffic              bool
	trafficEU, trafficUS float64
	trafficFor           time.Duration
	tls                  bool
	chunkHotRate         float64
	historyDir           string
	groups               int
	log                  logFlags
}

const demoLimit = "demo/tenant"

// devGateways are the default addresses of the dev gateways, and
// devGatewayMetrics those of their /metrics.
var (
	devGateways       = map[string]string{"eu": "127.0.0.1:7412", "us": "127.0.0.1:7422"}
	devGatewayMetrics = map[string]string{"eu": "127.0.0.1:7413", "us": "127.0.0.1:7423"}
)

// gatewayMetricsAddr is where a dev gateway serves /metrics: the flag if
// given, the default next to the default gateway, else a free port (a run
// that moved its gateway, e.g. a test on free ports, must not collide on
// the default).
func gatewayMetricsAddr(region, flagged, gateway string) string {
	switch {
	case flagged != "":
		return flagged
	case gateway == devGateways[region]:
		return devGatewayMetrics[region]
	}
	return "127.0.0.1:0"
}

func (c *devConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.dataDir, "data-dir", "leasehold-data/dev", "data directory of the embedded etcd (reused across runs)")
	fs.StringVar(&c.allocGRPC, "allocator-grpc", "127.0.0.1:7400", "allocator gRPC address")
	fs.StringVar(&c.allocHTTP, "allocator-http", "127.0.0.1:7401", "allocator HTTP address")
	fs.StringVar(&c.etcdClient, "etcd-client-addr", "127.0.0.1:7402", "embedded etcd client address")
	fs.StringVar(&c.etcdPeer, "etcd-peer-addr", "127.0.0.1:7403", "embedded etcd peer address")
	fs.StringVar(&c.euGRPC, "eu-grpc", "127.0.0.1:7410", "agent eu gRPC address")
	fs.StringVar(&c.euHTTP, "eu-http", "127.0.0.1:7411", "agent eu HTTP address")
	fs.StringVar(&c.usGRPC, "us-grpc", "127.0.0.1:7420", "agent us gRPC address")
	fs.StringVar(&c.usHTTP, "us-http", "127.0.0.1:7421", "agent us HTTP address")
	fs.StringVar(&c.euGateway, "eu-gateway", devGateways["eu"], "HTTP gateway of region eu (limits by the X-Tenant header: demo/{tenant})")
	fs.StringVar(&c.usGateway, "us-gateway", devGateways["us"], "HTTP gateway of region us")
	fs.StringVar(&c.euGatewayMetrics, "eu-gateway-metrics", "",
		"/metrics of gateway eu (default "+devGatewayMetrics["eu"]+", or a free port when -eu-gateway is not its default)")
	fs.StringVar(&c.usGatewayMetrics, "us-gateway-metrics", "",
		"/metrics of gateway us (default "+devGatewayMetrics["us"]+", or a free port when -us-gateway is not its default)")
	fs.StringVar(&c.redis, "redis", "", "real Redis per region, e.g. eu=127.0.0.1:6379,us=127.0.0.1:6380; a region not named gets an embedded stand-in")
	fs.BoolVar(&c.noDemo, "no-demo", false, "do not create the demo limit "+demoLimit)
	fs.BoolVar(&c.traffic, "traffic", false, "drive HTTP demand for "+demoLimit+" through both regions' gateways and print each window")
	fs.Float64Var(&c.trafficEU, "traffic-eu", 900, "eu demand, requests per minute")
	fs.Float64Var(&c.trafficUS, "traffic-us", 400, "us demand, requests per minute")
	fs.DurationVar(&c.trafficFor, "traffic-for", 30*time.Minute, "stop the traffic after this long")
	fs.BoolVar(&c.tls, "tls", false, "TLS and mutual TLS everywhere, authentication on: a dev CA in DATA-DIR/tls (made once, reused), a new admin token each run")
	fs.Float64Var(&c.chunkHotRate, "chunk-hot-rate", regionagent.DefaultChunks.HotRate, "the agents' -chunk-hot-rate (0: off)")
	fs.StringVar(&c.historyDir, "history-dir", "", "record every component's history in `DIR` (allocator.jsonl, agent-eu.jsonl, gateway-eu.jsonl, ...); check it with leasehold history check DIR")
	fs.IntVar(&c.groups, "groups", 1, "allocator groups, each the authority for a share of the limits (g1 on -allocator-grpc and the embedded etcd, the others on free ports and the same etcd, each on its own prefix); 1 is one allocator that owns every limit")
	c.log.register(fs)
}

func (c *devConfig) redisAddrs() (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range splitList(c.redis) {
		r, addr, ok := strings.Cut(kv, "=")
		if !ok || (r != "eu" && r != "us") || addr == "" {
			return nil, usagef("-redis %q: want eu=ADDR,us=ADDR", kv)
		}
		if _, err := regionagent.ParseRedis(addr); err != nil {
			return nil, usagef("-redis %s: %v", r, err)
		}
		out[r] = addr
	}
	return out, nil
}

func runDevCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c devConfig
	var redisAddrs map[string]string
	validate := func() (err error) {
		if redisAddrs, err = c.redisAddrs(); err != nil {
			return err
		}
		if c.trafficEU < 0 || c.trafficUS < 0 || math.IsNaN(c.trafficEU+c.trafficUS) || c.trafficFor <= 0 {
			return usagef("-traffic-eu/-traffic-us must be >= 0 and -traffic-for > 0")
		}
		if err := checkHistoryDir(c.historyDir); err != nil {
			return err
		}
		if c.groups < 1 || c.groups > 8 {
			return usagef("-groups %d: want 1 to 8", c.groups)
		}
		return checkChunkHotRate(c.chunkHotRate)
	}
	log, err := setup("dev", c.register, &c.log, validate, args, stdout, stderr)
	if err != nil {
		return err
	}
	return runDev(ctx, c, redisAddrs, stdout, log)
}

func runDev(ctx context.Context, c devConfig, redisAddrs map[string]string, stdout io.Writer, log *slog.Logger) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	defer wg.Wait()
	fail := func(name string, err error) {
		if err != nil && ctx.Err() == nil {
			cancel(fmt.Errorf("%s: %w", name, err))
		}
	}

	readyc := make(chan allocReady, 1)
	// One allocator, no follower to take over: a session TTL of 10 s
	// (the allocator command's default is 2 s, for fast failover) keeps a
	// busy laptop's late keep-alive from ending the only leader's term.
	ac := allocatorConfig{grpcAddr: c.allocGRPC, httpAddr: c.allocHTTP, dataDir: filepath.Join(c.dataDir, "etcd"),
		etcdClientAddr: c.etcdClient, etcdPeerAddr: c.etcdPeer, etcdPrefix: "/leasehold/", regions: "eu,us",
		sessionTTL: 10 * time.Second, retention: time.Minute, maxTxnOps: 128, reportWindows: 60, reportLimits: 1000,
		auditRetention: allocator.DefaultAuditRetention}
	// With -history-dir: one history file per component, as if each were
	// a process of its own.
	historyFile := func(name string) string {
		if c.historyDir == "" {
			return ""
		}
		return filepath.Join(c.historyDir, name+history.Suffix)
	}
	if c.historyDir != "" {
		if err := os.MkdirAll(c.historyDir, 0o755); err != nil {
			return fmt.Errorf("-history-dir: %w", err)
		}
	}
	ac.history = historyFile("allocator")
	// With -tls: the server certificate on every listener, agents calling
	// the allocator with their region's certificate, gateways presenting
	// the server certificate to agents, and the dev user's token.
	tlsDir := filepath.Join(c.dataDir, "tls")
	var token string
	inDir := func(name string) string { return filepath.Join(tlsDir, name) }
	serve := tlsFlags{}
	hc := &http.Client{Timeout: 2 * time.Second}
	scheme := "http"
	if c.tls {
		var err error
		if token, err = devCerts(tlsDir); err != nil {
			return fmt.Errorf("dev certificates: %w", err)
		}
		serve = tlsFlags{cert: inDir(serverCertFile), key: inDir(serverKeyFile), ca: inDir(caCertFile), clientCA: inDir(caCertFile)}
		ac.tls, ac.authFile = serve, inDir(authFileName)
		pool, err := readPool("tls-ca", inDir(caCertFile))
		if err != nil {
			return err
		}
		hc.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
		scheme = "https"
	}
	startAllocator := func(name string, ac allocatorConfig) (allocReady, error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fail(name, runAllocator(ctx, ac, log.With("component", name), func(a *allocator.Allocator, g, h, e string) {
				readyc <- allocReady{a, g, h, e}
			}))
		}()
		var ar allocReady
		select {
		case ar = <-readyc:
		case <-ctx.Done():
			return ar, devErr(ctx)
		}
		lctx, lcancel := context.WithTimeout(ctx, 30*time.Second)
		err := ar.a.WaitLeader(lctx)
		lcancel()
		if err != nil {
			return ar, devErr(ctx)
		}
		return ar, nil
	}
	// With -groups: g1 runs the embedded etcd, every group has its own
	// prefix, and the group map names them all (docs/design.md).
	groupNames := []string{""}
	if c.groups > 1 {
		groupNames = nil
		for i := range c.groups {
			groupNames = append(groupNames, fmt.Sprintf("g%d", i+1))
		}
		ac.group, ac.groupMapKey, ac.groupMapNotice = groupNames[0], allocator.DefaultGroupMapKey, allocator.DefaultMapNotice
		ac.etcdPrefix = "/leasehold/g/" + groupNames[0] + "/"
	}
	ar, err := startAllocator("allocator", ac)
	if err != nil {
		return err
	}
	groupAllocs := map[string]allocReady{groupNames[0]: ar}
	for i, name := range groupNames[1:] {
		gc := ac
		gc.grpcAddr, gc.httpAddr, gc.etcdEndpoints = "127.0.0.1:0", "127.0.0.1:0", ar.etcd
		gc.etcdPrefix, gc.group = "/leasehold/g/"+name+"/", name
		gc.history = historyFile("allocator-" + name)
		if groupAllocs[name], err = startAllocator(fmt.Sprintf("allocator-%d", i+2), gc); err != nil {
			return err
		}
	}
	// home is the allocator that owns the demo limit.
	home := ar
	if c.groups > 1 {
		owner, err := writeDevGroupMap(ctx, ar.etcd, groupNames, groupAllocs)
		if err != nil {
			return err
		}
		home = groupAllocs[owner]
	}
	if !c.noDemo {
		if err := createDemo(ctx, home.a); err != nil {
			return err
		}
	}

	agentAddrs := map[string][2]string{"eu": {c.euGRPC, c.euHTTP}, "us": {c.usGRPC, c.usHTTP}}
	redisShown := map[string]string{}
	agentsReady := make(chan [3]string, 2)
	for _, region := range []string{"eu", "us"} {
		var rdb redis.UniversalClient
		if addr, ok := redisAddrs[region]; ok {
			rdb, _ = regionagent.ParseRedis(addr)
			redisShown[region] = addr
		} else {
			m := miniredis.NewMiniRedis()
			if err := m.StartAddr("127.0.0.1:0"); err != nil {
				return fmt.Errorf("embedded redis for %s: %w", region, err)
			}
			defer m.Close()
			rdb = redis.NewClient(&redis.Options{Addr: m.Addr()})
			redisShown[region] = m.Addr() + " (embedded stand-in)"
		}
		defer rdb.Close()
		agc := agentConfig{region: region, allocators: ar.grpc, grpcAddr: agentAddrs[region][0], httpAddr: agentAddrs[region][1],
			replicaID: region + "-dev", lead: 2 * time.Second, renewEvery: 250 * time.Millisecond, chunkHotRate: c.chunkHotRate, chunkWarmRate: regionagent.DefaultChunks.WarmRate,
			history: historyFile("agent-" + region)}
		if c.tls {
			agc.tls = serve
			agc.allocCert, agc.allocKey = agentFiles(region)
			agc.allocCert, agc.allocKey = inDir(agc.allocCert), inDir(agc.allocKey)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			fail("agent "+region, runAgent(ctx, agc, rdb, log.With("component", "agent-"+region), func(g, h string) {
				agentsReady <- [3]string{region, g, h}
			}))
		}()
	}
	got := map[string][2]string{}
	for len(got) < 2 {
		select {
		case r := <-agentsReady:
			got[r[0]] = [2]string{r[1], r[2]}
		case <-ctx.Done():
			return devErr(ctx)
		}
	}
	// A stand-in upstream service and a gateway per region in front of it,
	// limiting by the X-Tenant header (tenant "tenant" is demo/tenant).
	upstream, err := listen("upstream", "127.0.0.1:0")
	if err != nil {
		return err
	}
	upSrv := bounds.Service.Server(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hello from the upstream: %s %s\n", r.Method, r.URL.Path)
	}), nil)
	go func() { _ = upSrv.Serve(upstream) }()
	defer upSrv.Close()
	gateways := map[string]string{"eu": c.euGateway, "us": c.usGateway}
	gatewayMetrics := map[string]string{
		"eu": gatewayMetricsAddr("eu", c.euGatewayMetrics, c.euGateway),
		"us": gatewayMetricsAddr("us", c.usGatewayMetrics, c.usGateway),
	}
	gatewaysReady := make(chan [3]string, 2)
	for _, region := range []string{"eu", "us"} {
		gc := &gatewayConfig{listen: gateways[region], metricsAddr: gatewayMetrics[region],
			ready:    func(l, m string) { gatewaysReady <- [3]string{region, l, m} },
			upstream: "http://" + upstream.Addr().String(), agent: got[region][0],
			keyHeader: "X-Tenant", limitTemplate: "demo/{key}", subLeases: "on", missingKey: "reject", unknownLimit: "pass",
			timeout: 250 * time.Millisecond, jitter: time.Second, http: bounds.Gateway,
			history: historyFile("gateway-" + region), historyName: "gateway-" + region, historyRegion: region}
		if c.tls {
			gc.tls = tlsFlags{cert: serve.cert, key: serve.key, ca: serve.ca}
		}
		if err := gc.validate(); err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			fail("gateway "+region, runGateway(ctx, gc, log.With("component", "gateway-"+region)))
		}()
	}
	for n := 0; n < 2; n++ {
		select {
		case r := <-gatewaysReady:
			gatewayMetrics[r[0]] = r[2]
		case <-ctx.Done():
			return devErr(ctx)
		}
	}

	fmt.Fprintf(stdout, "leasehold dev: serving\n")
	fmt.Fprintf(stdout, "  allocator  gRPC %s  HTTP %s  (etcd %s, data %s)\n", ar.grpc, ar.http, ar.etcd, c.dataDir)
	for _, name := range groupNames[1:] {
		g := groupAllocs[name]
		fmt.Fprintf(stdout, "  allocator group %s gRPC %s  HTTP %s\n", name, g.grpc, g.http)
	}
	if c.groups > 1 {
		fmt.Fprintf(stdout, "  %d allocator groups (%s); the first is group %s; agents learn the map from it\n", c.groups, strings.Join(groupNames, ", "), groupNames[0])
	}
	for _, r := range []string{"eu", "us"} {
		fmt.Fprintf(stdout, "  agent %s   gRPC %s  HTTP %s  (redis %s)\n", r, got[r][0], got[r][1], redisShown[r])
	}
	for _, r := range []string{"eu", "us"} {
		m := "metrics off"
		if gatewayMetrics[r] != "" {
			m = "metrics http://" + gatewayMetrics[r] + "/metrics"
		}
		fmt.Fprintf(stdout, "  gateway %s HTTP %s  %s  (in front of %s)\n", r, gateways[r], m, upstream.Addr())
	}
	if !c.noDemo {
		fmt.Fprintf(stdout, "  demo limit %s: 1000 per minute, regions eu+us, strict\n", demoLimit)
	}
	if c.tls {
		fmt.Fprintf(stdout, "  TLS: CA %s; certificates and auth file in %s (user %q is admin)\n", inDir(caCertFile), tlsDir, devUser)
		fmt.Fprintf(stdout, "  token of %s (new every run, shown once): %s\n", devUser, token)
		fmt.Fprintf(stdout, "Try: curl -i --cacert %s -H 'X-Tenant: tenant' https://%s/\n", inDir(caCertFile), gateways["eu"])
		fmt.Fprintf(stdout, "     LEASEHOLD_TOKEN=%s go run ./cmd/quotactl --allocator %s --tls-ca %s limits list\n", token, ar.grpc, inDir(caCertFile))
		fmt.Fprintf(stdout, "     go run ./cmd/quotactl --allocator %s --tls-ca %s --tls-cert %s --tls-key %s limits list    (Ctrl-C stops)\n",
			ar.grpc, inDir(caCertFile), inDir(devUserCert), inDir(devUserKey))
	} else {
		fmt.Fprintf(stdout, "Try: curl -i -H 'X-Tenant: tenant' http://%s/    go run ./cmd/quotactl limits list    (Ctrl-C stops)\n", gateways["eu"])
	}
	if c.traffic {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tctx, tcancel := context.WithTimeout(ctx, c.trafficFor)
			defer tcancel()
			runTraffic(tctx, stdout, home.a, hc, scheme, gateways, map[string]float64{"eu": c.trafficEU, "us": c.trafficUS})
		}()
	}
	<-ctx.Done()
	return devErr(ctx)
}

// allocReady is an allocator of a dev system and its bound addresses.
type allocReady struct {
	a    *allocator.Allocator
	grpc string
	http string
	etcd string
}

// writeDevGroupMap writes the first version of the group map of a dev
// system (every group on its gRPC address) and returns the group that
// owns the demo limit.
func writeDevGroupMap(ctx context.Context, etcd string, names []string, allocs map[string]allocReady) (string, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return "", err
	}
	defer cli.Close()
	var groups []groupmap.Group
	for _, n := range names {
		groups = append(groups, groupmap.Group{Name: n, Allocators: []string{allocs[n].grpc}})
	}
	store := allocator.NewMapStore(cli, allocator.DefaultGroupMapKey, allocator.DefaultMapNotice)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// Each run writes a version naming this run's addresses (the ports
	// of groups after the first are new each run).
	cur, rev, err := store.Get(wctx)
	if err != nil {
		return "", fmt.Errorf("reading the group map: %w", err)
	}
	m, nrev, err := store.Change(wctx, rev, cur, time.Now(), groupmap.Change{Groups: groups, Reason: "leasehold dev"})
	if err != nil {
		return "", fmt.Errorf("writing the group map: %w", err)
	}
	for _, n := range names { // a group takes its limits once it has read the map
		if err := allocs[n].a.WaitGroupMap(wctx, nrev); err != nil {
			return "", fmt.Errorf("allocator group %s did not read the group map: %w", n, err)
		}
	}
	owner, _, _ := m.Owner(demoLimit, time.Now())
	return owner, nil
}

// devErr is nil on a clean stop, else why the dev system stopped.
func devErr(ctx context.Context) error {
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	return nil
}

// createDemo creates the demo limit unless it exists (a second run keeps
// what the first, or the user, set).
func createDemo(ctx context.Context, a *allocator.Allocator) error {
	zero := int64(0)
	_, err := a.PutLimit(ctx, &pb.Limit{
		Id: demoLimit, LimitTokens: 1000, Window: durationpb.New(time.Minute), Regions: []string{"eu", "us"},
		Mode: pb.Mode_MODE_STRICT, Owner: "leasehold dev", Description: "demo limit created by leasehold dev",
		Lease: &pb.LeaseSettings{Ttl: durationpb.New(15 * time.Second)},
	}, allocator.Change{Reason: "leasehold dev demo limit", Expected: &zero})
	if err != nil && !errors.Is(err, allocator.ErrVersionMismatch) {
		return fmt.Errorf("demo limit: %w", err)
	}
	return nil
}

// runTraffic sends HTTP requests for the demo limit through each region's
// gateway at its rate (requests per minute) and prints each window as it
// closes: what each region admitted (200), what was refused (429) and the
// pool left.
func runTraffic(ctx context.Context, out io.Writer, a *allocator.Allocator, hc *http.Client, scheme string, gateways map[string]string, perMin map[string]float64) {
	type counts struct{ admitted, denied atomic.Int64 }
	var mu sync.Mutex
	windows := map[int64]map[string]*counts{}
	at := func(w int64, r string) *counts {
		mu.Lock()
		defer mu.Unlock()
		if windows[w] == nil {
			windows[w] = map[string]*counts{"eu": {}, "us": {}}
		}
		return windows[w][r]
	}
	var wg sync.WaitGroup
	for r, addr := range gateways {
		rate := perMin[r] / 60
		if rate <= 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(time.Duration(float64(time.Second) / rate))
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+addr+"/orders", nil)
				req.Header.Set("X-Tenant", "tenant")
				resp, err := hc.Do(req)
				w := lease.WindowOf(time.Now(), time.Minute).Index
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK:
					at(w, r).admitted.Add(1)
				case http.StatusTooManyRequests, http.StatusServiceUnavailable:
					at(w, r).denied.Add(1)
				}
			}
		}()
	}
	fmt.Fprintf(out, "%-8s %6s %8s %8s %8s %8s %6s\n", "window", "G", "eu", "us", "total", "429", "pool")
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-tick.C:
		}
		cur := lease.WindowOf(time.Now(), time.Minute).Index
		mu.Lock()
		var done []int64
		for w := range windows {
			if w < cur && time.Now().After(lease.Window{Index: w, Length: time.Minute}.End().Add(2*time.Second)) {
				done = append(done, w)
			}
		}
		mu.Unlock()
		for _, w := range done {
			c := windows[w]
			var g, pool int64
			_ = a.View(func(_ time.Time, core *allocator.Core) {
				if l, ok := core.Limit(demoLimit); ok {
					g = l.Tokens
				}
				pool = core.Pool(demoLimit, w)
			})
			eu, us := c["eu"].admitted.Load(), c["us"].admitted.Load()
			start := lease.Window{Index: w, Length: time.Minute}.Start().Format("15:04:05")
			fmt.Fprintf(out, "%-8s %6d %8d %8d %8d %8d %6d\n", start, g, eu, us, eu+us, c["eu"].denied.Load()+c["us"].denied.Load(), pool)
			mu.Lock()
			delete(windows, w)
			mu.Unlock()
		}
	}
}
