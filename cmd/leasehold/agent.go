package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"leasehold/allocator/auth"
	"leasehold/internal/bounds"
	"leasehold/internal/history"
	"leasehold/internal/vocab"
	pb "leasehold/proto/leasehold/v1"
	"leasehold/regionagent"
	"leasehold/regionagent/envoyrls"
)

// agentConfig is everything `leasehold agent` takes.
type agentConfig struct {
	region, allocators, redis string
	grpcAddr, httpAddr        string
	replicaID                 string
	envoyMapping              string
	snapshotFile              string
	history                   string
	lead, renewEvery          time.Duration
	chunkHotRate              float64
	chunkWarmRate             float64
	tls                       tlsFlags
	allocCert, allocKey       string
	log                       logFlags
}

func (c *agentConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&c.region, "region", "", "region this agent serves (required), e.g. eu")
	fs.StringVar(&c.allocators, "allocator", "127.0.0.1:7400", "comma-separated allocator gRPC addresses (followers redirect to the leader)")
	fs.StringVar(&c.redis, "redis", "127.0.0.1:6379", "the region's Redis: HOST:PORT, redis://..., sentinel://MASTER@H:P,... or cluster://H:P,...")
	fs.StringVar(&c.grpcAddr, "grpc-addr", "127.0.0.1:7410", "gRPC listen address (RegionAgent service)")
	fs.StringVar(&c.httpAddr, "http-addr", "127.0.0.1:7411", "HTTP listen address (/metrics, /healthz)")
	fs.StringVar(&c.replicaID, "replica-id", "", "this replica's id, unique in the region (default: random)")
	fs.StringVar(&c.envoyMapping, "envoy-mapping", "", "YAML `FILE` mapping Envoy rate limit descriptors to limits: serves envoy.service.ratelimit.v3 on -grpc-addr, reloaded on change (docs/envoy.md)")
	fs.StringVar(&c.snapshotFile, "snapshot-file", "", "`FILE` keeping the region's last snapshot of its limits (besides Redis), for a restart while the allocator and Redis are both unreachable")
	fs.StringVar(&c.history, "history", "", "record every decision, sub-lease reservation and release to `FILE` (*.jsonl, appended; check with leasehold history check; docs/operations.md)")
	fs.DurationVar(&c.lead, "renew-lead", 2*time.Second, "renew when the balance would last less than this at the current demand, and this long before a busy limit's lease expires")
	fs.DurationVar(&c.renewEvery, "renew-interval", 250*time.Millisecond, "slack: a busy limit's next window's lease is fetched -renew-lead plus this before its window ends (the agent checks nothing on an interval; the name is kept for existing command lines)")
	fs.Float64Var(&c.chunkHotRate, "chunk-hot-rate", regionagent.DefaultChunks.HotRate, "decide a limit this replica is asked more than this cost per second in memory, from chunks of the region's bucket (0: off, every Check goes to Redis; see docs/design.md)")
	fs.Float64Var(&c.chunkWarmRate, "chunk-warm-rate", regionagent.DefaultChunks.WarmRate, "with chunks on, also decide in memory a limit this replica is asked more than this cost per second whose G is 128 or more, from chunks covering 4s of its rate, at most 1/64 of G (0: off)")
	c.tls.registerServe(fs, "-grpc-addr and -http-addr")
	c.tls.registerCA(fs, "the allocator and a rediss:// Redis")
	c.tls.registerClientCA(fs, "callers of -grpc-addr (gateways) must present a certificate of (mutual TLS)")
	fs.StringVar(&c.allocCert, "allocator-cert", "", "`FILE`: PEM client certificate presented to the allocator, naming leasehold://agent/REGION (needs -tls-ca)")
	fs.StringVar(&c.allocKey, "allocator-key", "", "`FILE`: PEM private key of -allocator-cert")
	c.log.register(fs)
}

func (c *agentConfig) validate() error {
	if err := vocab.ValidateRegion("-region", c.region); err != nil {
		return usagef("%v", err)
	}
	if len(splitList(c.allocators)) == 0 {
		return usagef("-allocator: at least one address is required")
	}
	if c.replicaID != "" {
		if err := vocab.ValidateRequestID("-replica-id", c.replicaID); err != nil {
			return usagef("%v", err)
		}
	}
	if c.lead <= 0 || c.renewEvery <= 0 {
		return usagef("-renew-lead and -renew-interval must be > 0")
	}
	if err := checkChunkRate("chunk-warm-rate", c.chunkWarmRate); err != nil {
		return err
	}
	if err := checkChunkHotRate(c.chunkHotRate); err != nil {
		return err
	}
	if err := checkHistoryFlag("history", c.history); err != nil {
		return err
	}
	if _, err := regionagent.ParseRedis(c.redis); err != nil {
		return usagef("-redis: %v", err)
	}
	if err := c.tls.validate(); err != nil {
		return err
	}
	switch {
	case (c.allocCert == "") != (c.allocKey == ""):
		return usagef("-allocator-cert and -allocator-key: give both or neither")
	case c.allocCert != "" && c.tls.ca == "":
		return usagef("-allocator-cert needs -tls-ca (the CA that signs the allocator's certificate)")
	}
	return nil
}

func runAgentCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var c agentConfig
	log, err := setup("agent", c.register, &c.log, c.validate, args, stdout, stderr)
	if err != nil {
		return err
	}
	var redisTLS *tls.Config
	if c.tls.ca != "" {
		var err error
		if redisTLS, _, err = clientTLS("tls-ca", c.tls.ca, "", "", "", ""); err != nil {
			return err
		}
	}
	rdb, _ := regionagent.ParseRedisTLS(c.redis, redisTLS)
	defer rdb.Close()
	return runAgent(ctx, c, rdb, log, nil)
}

// runAgent runs one agent replica on rdb until ctx ends. ready, if set, is
// told the bound addresses once the agent serves.
func runAgent(ctx context.Context, c agentConfig, rdb redis.UniversalClient, log *slog.Logger, ready func(grpcAddr, httpAddr string)) error {
	var envoyMap *envoyrls.Mapping
	if c.envoyMapping != "" {
		m, err := envoyrls.Load(c.envoyMapping)
		if err != nil {
			return err
		}
		envoyMap = m
	}
	sec, err := agentSecurity(c, log)
	if err != nil {
		return err
	}
	name := c.replicaID
	if name == "" {
		name = "agent-" + c.region // the records name the replica
	}
	hf, err := openHistory(c.history, history.Process{Name: name, Role: history.RoleAgent, Region: c.region})
	if err != nil {
		return err
	}
	defer closeHistory(hf, log.Warn) // after the agent's Close: its last releases are recorded
	gl, err := listen("grpc-addr", c.grpcAddr)
	if err != nil {
		return err
	}
	hl, err := listen("http-addr", c.httpAddr)
	if err != nil {
		gl.Close()
		return err
	}
	gopts := bounds.Agent.ServerOptions()
	if sec.grpc != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(sec.grpc.Config())))
		hl = tls.NewListener(hl, sec.http.Config())
	}
	reg := newRegistry()
	a, err := regionagent.New(regionagent.Config{
		Region: c.region, Allocators: splitList(c.allocators),
		DialOptions: []grpc.DialOption{dialCreds(sec.alloc)},
		Redis:       rdb, ReplicaID: c.replicaID, Logger: log, Registerer: reg,
	}, regionagent.WithRenewal(c.lead, c.renewEvery), regionagent.WithSnapshotFile(c.snapshotFile),
		regionagent.WithChunks(chunkConfig(c.chunkHotRate, c.chunkWarmRate)), regionagent.WithHistory(hf.rec))
	if err != nil {
		gl.Close()
		hl.Close()
		return err
	}
	defer a.Close()
	gs, hs := grpcServer(gopts...)
	regionagent.NewServer(a).Register(gs)
	var envoy *envoyrls.Server
	if envoyMap != nil {
		envoy = envoyrls.NewServer(a, envoyMap, envoyrls.WithRegisterer(reg), envoyrls.WithLogger(log))
		envoy.Register(gs)
	}
	hs.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	hs.SetServingStatus(pb.RegionAgent_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_NOT_SERVING)
	mux := metricsMux(reg, a.Status)
	httpSrv := bounds.Service.Server(mux, httpErrorLog(log))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	onHangup(ctx, log, sec.reloads)
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = a.Run(ctx) }()
	if envoy != nil {
		go envoy.Watch(ctx, c.envoyMapping, time.Second)
	}
	go func() {
		select {
		case <-a.Ready():
			hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
			hs.SetServingStatus(pb.RegionAgent_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
		case <-ctx.Done():
		}
	}()
	log.Info("agent serving", "region", c.region, "replica", a.ReplicaID(), "grpc", gl.Addr().String(),
		"http", hl.Addr().String(), "allocator", c.allocators)
	if ready != nil {
		ready(gl.Addr().String(), hl.Addr().String())
	}
	err = serveAll(ctx, log, gs, gl, httpSrv, hl)
	cancel()
	<-runDone
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	return nil
}

// agentSec is an agent's TLS, from its flags.
type agentSec struct {
	grpc, http *serverTLS  // nil: plaintext listeners
	alloc      *tls.Config // nil: plaintext to the allocator
	reloads    map[string]func() error
}

func agentSecurity(c agentConfig, log *slog.Logger) (*agentSec, error) {
	sec := &agentSec{reloads: map[string]func() error{}}
	if c.tls.cert == "" {
		log.Warn("TLS is off: the agent serves plaintext (give -tls-cert and -tls-key)")
	} else {
		var err error
		if sec.grpc, err = newServerTLS(c.tls, true); err != nil {
			return nil, err
		}
		// /metrics and /healthz: TLS, no client certificate asked.
		if sec.http, err = newServerTLS(tlsFlags{cert: c.tls.cert, key: c.tls.key}, false); err != nil {
			return nil, err
		}
		sec.reloads["TLS certificates"] = func() error {
			if err := sec.grpc.Reload(); err != nil {
				return err
			}
			return sec.http.Reload()
		}
	}
	if c.tls.ca == "" {
		log.Warn("TLS to the allocator is off: the agent calls it in plaintext, without a certificate (give -tls-ca, -allocator-cert and -allocator-key)")
		return sec, nil
	}
	cfg, reload, err := clientTLS("tls-ca", c.tls.ca, "allocator-cert", c.allocCert, "allocator-key", c.allocKey)
	if err != nil {
		return nil, err
	}
	if c.allocCert != "" {
		if err := checkAgentCert(c.allocCert, c.region); err != nil {
			return nil, err
		}
		sec.reloads["allocator certificate"] = func() error {
			if err := checkAgentCert(c.allocCert, c.region); err != nil {
				return err
			}
			return reload()
		}
	}
	sec.alloc = cfg
	return sec, nil
}

// checkAgentCert makes sure the certificate names this agent's region:
// the allocator would refuse every call for the region otherwise.
func checkAgentCert(file, region string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("-allocator-cert: %w", err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != "CERTIFICATE" {
		return fmt.Errorf("-allocator-cert %s: no PEM certificate", file)
	}
	cert, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return fmt.Errorf("-allocator-cert %s: %w", file, err)
	}
	id, err := auth.IdentityOf(cert)
	if err != nil {
		return fmt.Errorf("-allocator-cert %s: %w", file, err)
	}
	if id.Kind != auth.KindAgent || id.Name != region {
		return fmt.Errorf("-allocator-cert %s names %s, not agent/%s (-region)", file, id, region)
	}
	return nil
}

// checkChunkHotRate refuses a -chunk-hot-rate that is not a number >= 0.
func checkChunkHotRate(r float64) error { return checkChunkRate("chunk-hot-rate", r) }

// checkChunkRate refuses a chunk rate flag that is not a number >= 0.
func checkChunkRate(flag string, r float64) error {
	if r < 0 || math.IsNaN(r) || math.IsInf(r, 0) {
		return usagef("-%s must be a number >= 0 (0: off)", flag)
	}
	return nil
}

// chunkConfig is the agent's chunk settings with -chunk-hot-rate and
// -chunk-warm-rate.
func chunkConfig(hotRate, warmRate float64) regionagent.ChunkConfig {
	cfg := regionagent.DefaultChunks
	cfg.HotRate, cfg.WarmRate = hotRate, warmRate
	return cfg
}
