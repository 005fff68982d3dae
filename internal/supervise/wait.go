package supervise

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// pollEvery is how often the Wait functions ask again.
const pollEvery = 50 * time.Millisecond

// CheckGRPC asks addr's gRPC health service (plaintext) once whether
// service is SERVING; nil if it is.
func CheckGRPC(ctx context.Context, addr, service string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	return checkGRPC(ctx, healthpb.NewHealthClient(conn), service)
}

func checkGRPC(ctx context.Context, hc healthpb.HealthClient, service string) error {
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		return err
	}
	if resp.Status != healthpb.HealthCheckResponse_SERVING {
		return fmt.Errorf("%s is %v", service, resp.Status)
	}
	return nil
}

// WaitGRPC polls addr's gRPC health (plaintext) until service is SERVING,
// ctx ends, or exited (if not nil) is closed.
func WaitGRPC(ctx context.Context, addr, service string, exited <-chan struct{}) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	hc := healthpb.NewHealthClient(conn)
	return poll(ctx, exited, func() error { return checkGRPC(ctx, hc, service) },
		func(err error) error { return fmt.Errorf("%s not serving %s: %v", addr, service, err) })
}

// WaitHTTP polls GET url until it answers 200, ctx ends, or exited (if
// not nil) is closed.
func WaitHTTP(ctx context.Context, url string, exited <-chan struct{}) error {
	cl := &http.Client{Timeout: 500 * time.Millisecond}
	return poll(ctx, exited, func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := cl.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s", resp.Status)
		}
		return nil
	}, func(err error) error { return fmt.Errorf("%s not serving: %v", url, err) })
}

// Wait polls check until it returns nil, ctx ends, or exited (if not
// nil) is closed.
func Wait(ctx context.Context, exited <-chan struct{}, check func(context.Context) error) error {
	return poll(ctx, exited, func() error { return check(ctx) }, func(err error) error { return err })
}

func poll(ctx context.Context, exited <-chan struct{}, check func() error, failed func(error) error) error {
	t := time.NewTicker(pollEvery)
	defer t.Stop()
	var last error // the last answer before ctx ended: says more than "deadline exceeded"
	for {
		err := check()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil && last != nil {
			err = last
		}
		last = err
		select {
		case <-exited:
			return fmt.Errorf("process exited: %w", failed(err))
		case <-ctx.Done():
			return failed(err)
		case <-t.C:
		}
	}
}
