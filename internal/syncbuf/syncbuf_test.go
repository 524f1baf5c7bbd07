package syncbuf

import (
	"strings"
	"sync"
	"testing"
)

// TestConcurrent writes from several goroutines while another reads, under the race detector in CI,
// and checks that every write is there once.
func TestConcurrent(t *testing.T) {
	var b Buffer
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 100 {
				b.Write([]byte("x"))
				_ = b.String()
			}
		})
	}
	wg.Wait()
	if got := b.String(); got != strings.Repeat("x", 400) {
		t.Fatalf("%d bytes, want 400 x", len(got))
	}
}
