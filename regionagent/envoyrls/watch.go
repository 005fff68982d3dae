package envoyrls

import (
	"context"
	"crypto/sha256"
	"errors"
	"time"
)

// Watch reloads the mapping from path when its content changes, checking
// every interval, until ctx ends. A changed file is applied once it reads
// the same on two checks in a row (so a file caught half-written is not
// applied even if that half parses); a file that fails validation is
// refused, logged with its line and reason, and the mapping in force
// stays. The swap is atomic: each request uses one mapping throughout.
func (s *Server) Watch(ctx context.Context, path string, interval time.Duration) {
	if interval <= 0 {
		interval = time.Second
	}
	w := watcher{s: s, path: path}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.poll()
		}
	}
}

type watcher struct {
	s        *Server
	path     string
	pending  [sha256.Size]byte // content seen once, not applied yet
	havePend bool
	refused  [sha256.Size]byte // last content refused (logged once)
	readErr  string            // last read error (logged once)
}

func (w *watcher) poll() {
	data, err := readFile(w.path)
	if err != nil {
		if err.Error() != w.readErr {
			w.readErr = err.Error()
			w.s.log.Warn("envoy mapping unreadable; keeping the mapping in force", "path", w.path, "err", err)
		}
		return
	}
	w.readErr = ""
	h := sha256.Sum256(data)
	if h == w.s.m.Load().hash {
		w.havePend = false
		return
	}
	if !w.havePend || h != w.pending {
		w.pending, w.havePend = h, true // apply once it reads the same again
		return
	}
	if h == w.refused {
		return
	}
	m, err := parse(w.path, data)
	if err != nil {
		w.refused = h
		w.s.met.rejected.Inc()
		attrs := []any{"path", w.path, "err", err}
		var le *LoadError
		if errors.As(err, &le) {
			attrs = append(attrs, "line", le.Line, "reason", le.Reason)
		}
		w.s.log.Error("envoy mapping refused; keeping the mapping in force", attrs...)
		return
	}
	w.havePend = false
	w.s.m.Store(m)
	w.s.met.applied.Inc()
	w.s.log.Info("envoy mapping reloaded", "path", w.path, "mapping", m.String())
}
