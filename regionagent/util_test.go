package regionagent

import (
	"errors"
	"log/slog"
	"os"
)

func errorsAs(err error, target any) bool { return errors.As(err, target) }
func errorsIs(err, target error) bool     { return errors.Is(err, target) }

func testLogger() *slog.Logger {
	if os.Getenv("AGENT_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}
