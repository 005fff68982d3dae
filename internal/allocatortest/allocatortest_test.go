package allocatortest

import (
	"context"
	"errors"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// fake leads once Run has started, and records when Run returned.
type fake struct {
	led      chan struct{}
	returned chan struct{}
}

func (f *fake) Run(ctx context.Context) error {
	defer close(f.returned)
	close(f.led)
	<-ctx.Done()
	return ctx.Err()
}

func (f *fake) WaitLeader(ctx context.Context) error {
	select {
	case <-f.led:
		return nil
	case <-ctx.Done():
		return errors.New("no leader")
	}
}

func (f *fake) Leader() string { return "fake" }

func TestRunStop(t *testing.T) {
	f := &fake{led: make(chan struct{}), returned: make(chan struct{})}
	r := Run(t, f)
	WaitLeader(t, f)
	r.Stop()
	select {
	case <-f.returned:
	default:
		t.Fatal("Stop returned before Run did")
	}
	r.Stop() // again: nothing
}

type healthServices struct{}

func (healthServices) Register(s grpc.ServiceRegistrar) {
	healthpb.RegisterHealthServer(s, health.NewServer())
}

func TestServe(t *testing.T) {
	addr := Serve(t, nil, healthServices{})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", resp, err)
	}
}
