package qp

import (
	"testing"

	"github.com/goroce/goroce/mr"
	"github.com/goroce/goroce/wire"
)

// TestConnectRdAtomic: RdAtomic sets both depths, as the callers that exchange QP numbers out of band
// use it; with RdAtomic 0 the two depths the RDMA CM agrees on apart are applied apart (rounded up to
// powers of two, as rxe does).
func TestConnectRdAtomic(t *testing.T) {
	for _, tc := range []struct {
		name              string
		rd, max, dest     uint8
		wantMax, wantDest uint8
	}{
		{"RdAtomic both", 4, 1, 9, 4, 4},
		{"apart", 0, 1, 16, 1, 16},
		{"apart rounded", 0, 3, 5, 4, 8},
		{"none", 0, 0, 0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHost(t, "A", RC, 0x11, false)
			err := h.qp.Connect(epoch, &ConnectParams{AccessFlags: mr.RemoteRead, PathMTU: wire.MTU1024, DestQPN: 0x22,
				Timeout: 14, RetryCnt: 7, RNRRetry: 7, MinRNRTimer: 12, RdAtomic: tc.rd, MaxRdAtomic: tc.max,
				MaxDestRdAtomic: tc.dest})
			if err != nil {
				t.Fatal(err)
			}
			a := h.qp.Query()
			if a.State != StateRTS || a.MaxRdAtomic != tc.wantMax || a.MaxDestRdAtomic != tc.wantDest {
				t.Errorf("state %v, max_rd_atomic %d, max_dest_rd_atomic %d; want RTS, %d, %d", a.State,
					a.MaxRdAtomic, a.MaxDestRdAtomic, tc.wantMax, tc.wantDest)
			}
		})
	}
}
