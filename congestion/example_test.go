package congestion_test

import (
	"fmt"
	"time"

	"github.com/goroce/goroce/congestion"
)

// A switch marks a packet, the receiver's NP answers with a CNP, and the sender's reaction point halves
// its rate and then recovers on its increase timer.
func ExampleDCQCN() {
	start := time.Unix(0, 0)
	rp, _ := congestion.NewDCQCN(congestion.DefaultParams(40e9))
	np := congestion.NewNP(congestion.DefaultCNPInterval)
	cp := congestion.DefaultMarking()

	fmt.Printf("start: %.1f Gb/s\n", rp.Rate()/1e9)
	if cp.Mark(300_000, 0.5) && np.OnCE(start) { // a queue above Kmax marks every packet
		rp.OnCNP(start)
	}
	fmt.Printf("after a CNP: %.1f Gb/s, next timer at %v\n", rp.Rate()/1e9, rp.NextDeadline().Sub(start))
	for range 3 {
		rp.OnTimer(rp.NextDeadline())
	}
	fmt.Printf("after 3 fast-recovery steps: %.1f Gb/s\n", rp.Rate()/1e9)
	// Output:
	// start: 40.0 Gb/s
	// after a CNP: 20.0 Gb/s, next timer at 55µs
	// after 3 fast-recovery steps: 37.5 Gb/s
}
