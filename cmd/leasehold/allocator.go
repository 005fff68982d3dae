package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"leasehold/allocator"
	"leasehold/allocator/adminhttp"
	"leasehold/allocator/auth"
	"leasehold/allocator/embedded"
	"leasehold/allocator/statuspage"
	"leasehold/internal/bounds"
	"leasehold/internal/groupmap"
	"leasehold/internal/history"
	"leasehold/internal/vocab"
)

// allocatorConfig is everything `leasehold allocator` takes.
type allocatorConfig struct {
	grpcAddr, httpAddr, advertise string
	dataDir                       string
	etcdEndpoints                 string
	etcdClientAddr, etcdPeerAddr  string
	etcdPrefix                    string
	regions                       string
	sessionTTL, retention         time.Duration
	maxTxnOps                     int
	reportWindows, reportLimits   int
	auditRetention                time.Duration
	tls                           tlsFlags
	authFile                      string
	history                       string
	etcdCA, etcdCert, etcdKey     string
	group, groupMapKey            string
	groupMapEndpoints             string
	groupMapNotice                time.Duration
	log                           logFlags
}

func (c *allocatorConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.grpcAddr, "grpc-addr", "127.0.0.1:7400", "gRPC listen address (Allocator and Admin services)")
	fs.StringVar(&c.httpAddr, "http-addr", "127.0.0.1:7401", "HTTP listen address (/metrics, /healthz)")
	fs.StringVar(&c.advertise, "advertise", "", "gRPC address told to callers of followers (default: the -grpc-addr bound)")
	fs.StringVar(&c.dataDir, "data-dir", "leasehold-data/allocator", "embedded etcd's data directory (reused across runs)")
	fs.StringVar(&c.etcdEndpoints, "etcd-endpoints", "", "comma-separated etcd client URLs of an external cluster; empty runs an embedded single member")
	fs.StringVar(&c.etcdClientAddr, "etcd-client-addr", "127.0.0.1:2379", "embedded etcd's client address")
	fs.StringVar(&c.etcdPeerAddr, "etcd-peer-addr", "127.0.0.1:2380", "embedded etcd's peer address")
	fs.StringVar(&c.etcdPrefix, "etcd-prefix", "/leasehold/", "prefix of every key the allocator writes")
	fs.StringVar(&c.regions, "regions", "eu,us", "comma-separated regions limits may name")
	fs.DurationVar(&c.sessionTTL, "session-ttl", 2*time.Second, "etcd session TTL: how fast a follower replaces a dead leader")
	fs.DurationVar(&c.retention, "retention", time.Minute, "how long grant records are kept after their window ends")
	fs.IntVar(&c.maxTxnOps, "max-txn-ops", 128, "grants per etcd transaction (group commit); at most etcd's --max-txn-ops")
	fs.IntVar(&c.reportWindows, "report-windows", 60, "closed windows kept per limit for reports (quotactl windows, /status)")
	fs.IntVar(&c.reportLimits, "report-limits", 1000, "most limits the per-limit window metrics cover (cardinality cap)")
	fs.DurationVar(&c.auditRetention, "audit-retention", allocator.DefaultAuditRetention, "how long the audit log and limit history are kept (the leader sweeps hourly)")
	c.tls.registerServe(fs, "-grpc-addr and -http-addr")
	c.tls.registerClientCA(fs, "callers' client certificates must chain to (agents: always; users: or a token); turns authentication on")
	fs.StringVar(&c.authFile, "auth-file", "", "`FILE`: users, roles, scopes and token hashes (leasehold certs writes one); turns authentication on; reloaded on SIGHUP")
	fs.StringVar(&c.history, "history", "", "record every grant, return and usage report this replica answers to `FILE` (*.jsonl, appended; grants and returns written before the answer leaves; docs/operations.md)")
	fs.StringVar(&c.etcdCA, "etcd-ca", "", "`FILE`: PEM CA bundle that signs the -etcd-endpoints' certificates (turns etcd client TLS on)")
	fs.StringVar(&c.etcdCert, "etcd-cert", "", "`FILE`: PEM client certificate presented to etcd (with -etcd-key)")
	fs.StringVar(&c.etcdKey, "etcd-key", "", "`FILE`: PEM private key of -etcd-cert")
	fs.StringVar(&c.group, "group", "", "`NAME` of this allocator's group when the limits are sharded over several allocator groups (each with its own -etcd-prefix or cluster); it grants only the windows the group map gives it. Empty: one group owns every limit")
	fs.StringVar(&c.groupMapKey, "group-map-key", allocator.DefaultGroupMapKey, "etcd key of the group map (with -group)")
	fs.StringVar(&c.groupMapEndpoints, "group-map-endpoints", "", "comma-separated etcd client URLs of the cluster that holds the group map (with -group; default: this allocator's etcd)")
	fs.DurationVar(&c.groupMapNotice, "group-map-notice", allocator.DefaultMapNotice, "how long before it governs a new group map version is written; every allocator and quotactl of one map must use the same")
	c.log.register(fs)
}

func (c *allocatorConfig) validate() error {
	if len(splitList(c.regions)) == 0 {
		return usagef("-regions: at least one region is required")
	}
	for i, r := range splitList(c.regions) {
		if err := vocab.ValidateRegion(fmt.Sprintf("-regions[%d]", i), r); err != nil {
			return usagef("%v", err)
		}
	}
	if c.sessionTTL < time.Second {
		return usagef("-session-ttl %v: must be >= 1s", c.sessionTTL)
	}
	if c.retention < 0 {
		return usagef("-retention %v: must be >= 0", c.retention)
	}
	if c.maxTxnOps < 1 {
		return usagef("-max-txn-ops %d: must be >= 1", c.maxTxnOps)
	}
	if c.auditRetention <= 0 {
		return usagef("-audit-retention %v: must be > 0", c.auditRetention)
	}
	if c.reportWindows < 1 || c.reportLimits < 0 {
		return usagef("-report-windows must be >= 1 and -report-limits >= 0")
	}
	if err := checkHistoryFlag("history", c.history); err != nil {
		return err
	}
	if c.group != "" {
		if err := groupmap.ValidateName("-group", c.group); err != nil {
			return usagef("%v", err)
		}
		if c.groupMapNotice < 2*time.Second {
			return usagef("-group-map-notice %v: must be >= 2s (agents re-read the map every second)", c.groupMapNotice)
		}
	} else if c.groupMapEndpoints != "" {
		return usagef("-group-map-endpoints is for -group")
	}
	if err := c.tls.validate(); err != nil {
		return err
	}
	switch {
	case c.authFile != "" && c.tls.cert == "":
		return usagef("-auth-file needs -tls-cert and -tls-key: tokens never cross plaintext")
	case (c.etcdCert == "") != (c.etcdKey == ""):
		return usagef("-etcd-cert and -etcd-key: give both or neither")
	case (c.etcdCA != "" || c.etcdCert != "") && c.etcdEndpoints == "":
		return usagef("-etcd-ca, -etcd-cert and -etcd-key are for -etcd-endpoints (the embedded member listens on loopback, plaintext)")
	}
	return nil
}

func runAllocatorCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c allocatorConfig
	log, err := setup("allocator", c.register, &c.log, c.validate, args, stdout, stderr)
	if err != nil {
		return err
	}
	return runAllocator(ctx, c, log, nil)
}

// allocatorReady reports the allocator and its bound addresses once it
// serves.
type allocatorReady func(a *allocator.Allocator, grpcAddr, httpAddr, etcdEndpoint string)

// runAllocator runs one allocator replica until ctx ends.
func runAllocator(ctx context.Context, c allocatorConfig, log *slog.Logger, ready allocatorReady) error {
	sec, err := allocatorSecurity(c, log)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	onHangup(ctx, log, sec.reloads)
	var etcdTLS *tls.Config
	if c.etcdCA != "" || c.etcdCert != "" {
		if etcdTLS, _, err = clientTLS("etcd-ca", c.etcdCA, "etcd-cert", c.etcdCert, "etcd-key", c.etcdKey); err != nil {
			return err
		}
	}
	endpoints := splitList(c.etcdEndpoints)
	if len(endpoints) == 0 {
		e, err := embedded.Start(ctx, embedded.Config{Dir: c.dataDir, ClientAddr: c.etcdClientAddr, PeerAddr: c.etcdPeerAddr})
		if err != nil {
			return err
		}
		defer e.Close()
		endpoints = []string{e.Endpoint()}
		log.Info("embedded etcd serving", "endpoint", e.Endpoint(), "data_dir", c.dataDir)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), TLS: etcdTLS})
	if err != nil {
		return fmt.Errorf("etcd client: %w", err)
	}
	defer cli.Close()

	gl, err := listen("grpc-addr", c.grpcAddr)
	if err != nil {
		return err
	}
	hl, err := listen("http-addr", c.httpAddr)
	if err != nil {
		gl.Close()
		return err
	}
	advertise := c.advertise
	if advertise == "" {
		advertise = gl.Addr().String()
	}
	hf, err := openHistory(c.history, history.Process{Name: advertise, Role: history.RoleAllocator})
	if err != nil {
		gl.Close()
		hl.Close()
		return err
	}
	defer closeHistory(hf, log.Warn)
	reg := newRegistry()
	opts := []allocator.Option{allocator.WithSessionTTL(c.sessionTTL), allocator.WithGroupCommit(c.maxTxnOps, 4),
		allocator.WithRetention(c.retention, 10*time.Second), allocator.WithReports(c.reportWindows, c.reportLimits),
		allocator.WithAuditRetention(c.auditRetention, time.Hour), allocator.WithHistory(hf.rec)}
	if c.group != "" {
		mapCli := cli
		if eps := splitList(c.groupMapEndpoints); len(eps) > 0 {
			if mapCli, err = clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), TLS: etcdTLS}); err != nil {
				gl.Close()
				hl.Close()
				return fmt.Errorf("group map etcd client: %w", err)
			}
			defer mapCli.Close()
		}
		vctx, vcancel := context.WithTimeout(ctx, 10*time.Second)
		view, err := allocator.NewMapView(vctx, allocator.NewMapStore(mapCli, c.groupMapKey, c.groupMapNotice), time.Now)
		vcancel()
		if err != nil {
			gl.Close()
			hl.Close()
			return fmt.Errorf("reading the group map: %w", err)
		}
		opts = append(opts, allocator.WithGroup(c.group, view))
		log.Info("allocator group", "group", c.group, "map_key", c.groupMapKey)
	}
	a, err := allocator.New(allocator.Config{
		Client: cli, Prefix: c.etcdPrefix, Regions: splitList(c.regions), Advertise: advertise,
		Logger: log, Registerer: reg,
	}, opts...)
	if err != nil {
		return err
	}
	guard := auth.NewGuard(sec.authn, log, reg)
	gopts := append(bounds.Allocator.ServerOptions(), guard.ServerOptions()...)
	if sec.tls != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(sec.tls.Config())))
		hl = tls.NewListener(hl, sec.tls.Config())
	}
	gs, hs := grpcServer(gopts...)
	adminSrv := allocator.NewServer(a, allocator.WithAuthRequired(sec.authn != nil))
	adminSrv.Register(gs)
	// The Admin API as JSON over HTTP: the same service, in process.
	adminHTTP, err := adminhttp.New(adminhttp.Config{Admin: adminSrv, Authenticator: guard.Authenticator(), Logger: log, Registerer: reg})
	if err != nil {
		return err
	}
	mux := metricsMux(reg, func() (bool, string) {
		if a.IsLeader() {
			return true, "ok: leader"
		}
		return true, "ok: follower; leader " + a.Leader()
	})
	mux.Handle("GET /status", guard.Require(auth.ActionRead, statuspage.Handler(a)))
	httpSrv := bounds.Service.Server(adminHTTP.Mount(mux), httpErrorLog(log))

	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = a.Run(ctx) }()
	go allocator.ServeHealth(ctx, a, hs)
	log.Info("allocator serving", "grpc", gl.Addr().String(), "http", hl.Addr().String(), "advertise", advertise,
		"regions", c.regions)
	if ready != nil {
		ready(a, gl.Addr().String(), hl.Addr().String(), endpoints[0])
	}
	err = serveAll(ctx, log, gs, gl, httpSrv, hl)
	cancel()
	<-runDone
	return err
}

// allocatorSec is the allocator's TLS and authentication.
type allocatorSec struct {
	tls     *serverTLS         // nil: plaintext
	authn   auth.Authenticator // nil: authentication off
	reloads map[string]func() error
}

// allocatorSecurity reads the allocator's TLS and auth files, as its flags
// name them. Authentication is on when a client CA or an auth file is
// given; every file named is reloaded on SIGHUP.
func allocatorSecurity(c allocatorConfig, log *slog.Logger) (*allocatorSec, error) {
	sec := &allocatorSec{reloads: map[string]func() error{}}
	if c.tls.cert == "" {
		log.Warn("TLS is off: the allocator serves plaintext (give -tls-cert and -tls-key)")
	} else {
		s, err := newServerTLS(c.tls, false)
		if err != nil {
			return nil, err
		}
		sec.tls, sec.reloads["TLS certificates"] = s, s.Reload
	}
	if c.tls.clientCA == "" && c.authFile == "" {
		log.Warn("authentication is off: every caller may do everything (give -tls-client-ca and -auth-file)")
		return sec, nil
	}
	cfg := &auth.Config{}
	if c.authFile != "" {
		var err error
		if cfg, err = auth.LoadConfig(c.authFile); err != nil {
			return nil, err
		}
	}
	users, err := auth.NewUsers(cfg)
	if err != nil {
		return nil, err
	}
	sec.authn = users
	if c.authFile != "" {
		sec.reloads["auth file"] = func() error {
			cfg, err := auth.LoadConfig(c.authFile)
			if err != nil {
				return err
			}
			return users.Reload(cfg)
		}
	}
	log.Info("authentication on", "users", len(cfg.Users), "client_ca", c.tls.clientCA != "")
	return sec, nil
}
