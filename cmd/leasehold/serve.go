package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"leasehold/internal/logcap"
)

var errHelp = errors.New("help requested")

// parseFlags parses args with flags anywhere among them and turns every
// parse problem into a usage error. -h prints the flags to stdout.
func parseFlags(fs *flag.FlagSet, args []string, stdout io.Writer) ([]string, error) {
	fs.SetOutput(io.Discard)
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(stdout)
				fmt.Fprintf(stdout, "usage: leasehold %s [flags]\n", fs.Name())
				fs.PrintDefaults()
				return nil, errHelp
			}
			return nil, usagef("%v", err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// setup parses a server command's flags (it takes no positional
// arguments), runs validate, and returns the logger the flags ask for.
func setup(name string, register func(*flag.FlagSet), lf *logFlags, validate func() error,
	args []string, stdout, stderr io.Writer) (*slog.Logger, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	register(fs)
	pos, err := parseFlags(fs, args, stdout)
	if err != nil {
		return nil, err
	}
	if len(pos) > 0 {
		return nil, usagef("unexpected argument %q", pos[0])
	}
	if err := validate(); err != nil {
		return nil, err
	}
	return lf.logger(stderr)
}

// logFlags are the logging flags every server command has.
type logFlags struct {
	level  string
	format string
}

func (l *logFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&l.level, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&l.format, "log-format", "text", "log format: text or json")
}

// logger is the process's logger, capped (leasehold/internal/logcap):
// every message and string value at most 1 KiB, a record's strings at
// most 8 KiB, 64 attributes, and each message at most 10 lines a second
// after a burst of 100, so no input can make a line or a flood unbounded.
func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(l.level)); err != nil {
		return nil, usagef("-log-level %q: want debug, info, warn or error", l.level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	var h slog.Handler
	switch l.format {
	case "text":
		h = slog.NewTextHandler(w, opts)
	case "json":
		h = slog.NewJSONHandler(w, opts)
	default:
		return nil, usagef("-log-format %q: want text or json", l.format)
	}
	return slog.New(logcap.New(h, logcap.Defaults)), nil
}

// newRegistry returns a registry of its own with the Go and process
// collectors (never the global one: embedded etcd registers there).
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// grpcServer is a gRPC server with health checking and reflection.
func grpcServer(opts ...grpc.ServerOption) (*grpc.Server, *health.Server) {
	s := grpc.NewServer(opts...)
	h := health.NewServer()
	healthpb.RegisterHealthServer(s, h)
	reflection.Register(s)
	return s, h
}

// listen binds addr, naming the flag in the error.
func listen(flagName, addr string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-%s %s: %w", flagName, addr, err)
	}
	return l, nil
}

// serveAll runs the gRPC and HTTP servers until ctx ends or one fails,
// then stops both (gracefully, within a few seconds).
func serveAll(ctx context.Context, log *slog.Logger, gs *grpc.Server, gl net.Listener, hs *http.Server, hl net.Listener) error {
	errc := make(chan error, 2)
	go func() { errc <- gs.Serve(gl) }()
	go func() {
		if err := hs.Serve(hl); !errors.Is(err, http.ErrServerClosed) {
			errc <- err
			return
		}
		errc <- nil
	}()
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = hs.Shutdown(sctx)
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-sctx.Done():
		gs.Stop()
	}
	if err != nil {
		log.Error("server failed", "err", err)
	}
	return err
}

// splitList splits a comma-separated flag value, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// metricsMux serves /metrics from reg and /healthz from healthy.
func metricsMux(reg *prometheus.Registry, healthy func() (bool, string)) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		ok, detail := healthy()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		fmt.Fprintln(w, detail)
	})
	return mux
}
