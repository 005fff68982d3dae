// Package syncbuf is a bytes.Buffer that is safe for concurrent use: the
// sink for a child process's output, a server's log or a command's stderr
// that a test reads while it is still being written.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer collects what is written to it. The zero value is an empty
// buffer ready to use; its methods are safe for concurrent use.
type Buffer struct {
	mu sync.Mutex // protects b
	b  bytes.Buffer
}

// Write appends p.
func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
