package perftest

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// resultLine is perftest's RESULT_LINE.
var resultLine = strings.Repeat("-", 87)

// The result tables' header lines (RESULT_FMT and RESULT_FMT_LAT).
const (
	bwHeader  = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
	latHeader = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n"
)

// LatReport is one line of a latency test's results, as perftest's print_report_lat computes it from
// its samples: one-way latencies in microseconds (half a round trip; a whole READ).
type LatReport struct {
	Size, Iters                 int
	Min, Max, Typical, Avg      float64 // Typical is the median
	Stdev                       float64
	Percentile99, Percentile999 float64
}

// latReport summarizes samples; false if there are none.
func latReport(size, iters int, samples []time.Duration) (LatReport, bool) {
	if len(samples) == 0 {
		return LatReport{}, false
	}
	us := make([]float64, len(samples))
	for i, s := range samples {
		us[i] = float64(s.Nanoseconds()) / 1e3
	}
	slices.Sort(us)
	n := len(us)
	var sum float64
	for _, v := range us {
		sum += v
	}
	avg := sum / float64(n)
	var sq float64
	for _, v := range us {
		sq += (v - avg) * (v - avg)
	}
	median := us[n/2]
	if n%2 == 0 {
		median = (us[n/2-1] + us[n/2]) / 2
	}
	pct := func(q float64) float64 { return us[max(int(math.Ceil(float64(n)*q))-1, 0)] }
	return LatReport{Size: size, Iters: iters, Min: us[0], Max: us[n-1], Typical: median, Avg: avg,
		Stdev: math.Sqrt(sq / float64(n)), Percentile99: pct(0.99), Percentile999: pct(0.999)}, true
}

// cAltHex formats v as C's "%#0<width>x": zero-padded to width including the "0x", and a zero
// without the prefix.
func cAltHex(v uint64, width int) string {
	if v == 0 {
		return fmt.Sprintf("%0*x", width, 0)
	}
	return fmt.Sprintf("0x%0*x", max(width-2, 0), v)
}

// printInfo prints ctx_print_test_info's block.
func (p *peer) printInfo(w io.Writer, h Hello, client bool) {
	sh, o := p.sh, p.o
	fmt.Fprintln(w, resultLine)
	fmt.Fprintf(w, "%s%s\n", strings.Repeat(" ", 20), o.Test.Title(o.AtomicCAS))
	fmt.Fprintf(w, " Dual-port       : OFF\t\tDevice         : goroce\n")
	fmt.Fprintf(w, " Number of qps   : 1\t\tTransport type : IB\n")
	fmt.Fprintf(w, " Connection type : RC\t\tUsing SRQ      : OFF\n")
	switch {
	case client && sh.lat:
		fmt.Fprintf(w, " TX depth        : 1\n")
	case client:
		fmt.Fprintf(w, " TX depth        : %d\n", min(o.TxDepth, o.Iters))
	case sh.verb == Send:
		fmt.Fprintf(w, " RX depth        : %d\n", min(o.RxDepth, o.Iters))
	}
	if !sh.lat {
		fmt.Fprintf(w, " CQ Moderation   : %d\n", min(o.CQMod, o.TxDepth, o.Iters))
	}
	fmt.Fprintf(w, " Mtu             : %d[B]\n", h.MTU.Bytes())
	fmt.Fprintf(w, " Link type       : Ethernet\n")
	if o.GIDIndex >= 0 {
		fmt.Fprintf(w, " GID index       : %d\n", o.GIDIndex)
	}
	if sh.verb == Read || sh.verb == Atomic {
		fmt.Fprintf(w, " Outstand reads  : %d\n", p.local.OutReads)
	} else {
		fmt.Fprintf(w, " Max inline data : 0[B]\n")
	}
	fmt.Fprintf(w, " rdma_cm QPs\t : OFF\n")
	fmt.Fprintf(w, " Data ex. method : Ethernet\n")
	fmt.Fprintln(w, resultLine)
}

// printDest prints ctx_print_pingpong_data: the address line and the GID in decimal bytes.
func (p *peer) printDest(w io.Writer, side string, d Dest) {
	fmt.Fprintf(w, " %s address: LID %s QPN %s PSN %s", side, cAltHex(uint64(d.LID), 4), cAltHex(uint64(d.QPN), 6), cAltHex(uint64(d.PSN), 6))
	switch p.sh.verb {
	case Read, Atomic:
		fmt.Fprintf(w, " OUT %s", cAltHex(uint64(d.OutReads), 4))
		fallthrough
	case Write:
		fmt.Fprintf(w, " RKey %s VAddr %s", cAltHex(uint64(d.RKey), 8), cAltHex(d.VAddr, 16))
	}
	fmt.Fprintln(w)
	g := make([]string, len(d.GID))
	for i, b := range d.GID {
		g[i] = fmt.Sprintf("%02d", b)
	}
	fmt.Fprintf(w, " GID: %s\n", strings.Join(g, ":"))
}

// printBW prints a bandwidth result line (REPORT_FMT).
func printBW(w io.Writer, r BWReport) {
	fmt.Fprintf(w, " %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f\n", r.Size, r.Iters, r.BWPeak, r.BWAvg, r.MsgRate)
}

// printLat prints a latency result line (REPORT_FMT_LAT).
func printLat(w io.Writer, l LatReport) {
	fmt.Fprintf(w, " %-7d %d          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f\n",
		l.Size, l.Iters, l.Min, l.Max, l.Typical, l.Avg, l.Stdev, l.Percentile99, l.Percentile999)
}
