package perftest

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// resultLine is perftest's RESULT_LINE.
var resultLine = strings.Repeat("-", 87)

// The result tables' header lines (RESULT_FMT, RESULT_FMT_G, RESULT_FMT_LAT and RESULT_FMT_LAT_DUR).
const (
	bwHeader     = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n"
	bwHeaderG    = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
	latHeader    = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n"
	latDurHeader = " #bytes        #iterations       t_avg[usec]    tps average\n"
)

// LatReport is one line of a latency test's results, as perftest's print_report_lat computes it from
// its samples: one-way latencies in microseconds (half a round trip; a whole READ or atomic). A
// Duration run's line (print_report_lat_duration) has only Size, Iters (the round trips within the
// window), Avg and TPS, the round trips per second.
type LatReport struct {
	Size, Iters                 int
	Min, Max, Typical, Avg      float64 // Typical is the median
	Stdev                       float64
	Percentile99, Percentile999 float64
	TPS                         float64
}

// latReport summarizes samples; false if there are none.
func latReport(size, iters int, samples []time.Duration) (LatReport, bool) {
	if len(samples) == 0 {
		return LatReport{}, false
	}
	us := usec(samples)
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

// latDurReport is a Duration run's line: count round trips within window, of which a sample is one
// way (rtt 2: SEND and WRITE) or whole (rtt 1: READ and atomics).
func latDurReport(size, count int, window time.Duration, rtt int) LatReport {
	l := LatReport{Size: size, Iters: count}
	if count > 0 {
		l.Avg = float64(window.Nanoseconds()) / 1e3 / float64(rtt) / float64(count)
		l.TPS = float64(count) / window.Seconds()
	}
	return l
}

// usec returns samples in microseconds.
func usec(samples []time.Duration) []float64 {
	us := make([]float64, len(samples))
	for i, s := range samples {
		us[i] = float64(s.Nanoseconds()) / 1e3
	}
	return us
}

// cAltHex formats v as C's "%#0<width>x": zero-padded to width including the "0x", and a zero
// without the prefix.
func cAltHex(v uint64, width int) string {
	if v == 0 {
		return fmt.Sprintf("%0*x", width, 0)
	}
	return fmt.Sprintf("0x%0*x", max(width-2, 0), v)
}

// cG formats v as C's "%g": six significant digits, trailing zeros dropped.
func cG(v float64) string { return strconv.FormatFloat(v, 'g', 6, 64) }

// printInfo prints ctx_print_test_info's block.
func (p *peer) printInfo(w io.Writer, h Hello) {
	sh, o, client := p.sh, &p.o, p.client
	timed := o.Duration > 0 || o.RunInfinitely
	fmt.Fprintln(w, resultLine)
	fmt.Fprintf(w, "%s%s\n", strings.Repeat(" ", 20), o.Test.title(o.AtomicCAS, o.Bidirectional))
	fmt.Fprintf(w, " Dual-port       : OFF\t\tDevice         : goroce\n")
	fmt.Fprintf(w, " Number of qps   : %d\t\tTransport type : IB\n", o.QPs)
	fmt.Fprintf(w, " Connection type : RC\t\tUsing SRQ      : OFF\n")
	if client || o.Bidirectional {
		fmt.Fprintf(w, " TX depth        : %d\n", p.txDepth())
	}
	if sh.verb == Send && (!client || o.Bidirectional) {
		fmt.Fprintf(w, " RX depth        : %d\n", p.rxDepthShown(timed))
	}
	if !sh.lat {
		fmt.Fprintf(w, " CQ Moderation   : %d\n", p.cqMod())
	}
	fmt.Fprintf(w, " Mtu             : %d[B]\n", h.MTU.Bytes())
	fmt.Fprintf(w, " Link type       : Ethernet\n")
	if o.GIDIndex >= 0 {
		fmt.Fprintf(w, " GID index       : %d\n", o.GIDIndex)
	}
	if sh.verb == Read || sh.verb == Atomic {
		fmt.Fprintf(w, " Outstand reads  : %d\n", p.local[0].OutReads)
	} else {
		fmt.Fprintf(w, " Max inline data : %d[B]\n", o.InlineSize)
	}
	if o.RDMACM {
		fmt.Fprintf(w, " rdma_cm QPs\t : ON\n")
		fmt.Fprintf(w, " Data ex. method : rdma_cm\n")
	} else {
		fmt.Fprintf(w, " rdma_cm QPs\t : OFF\n")
		fmt.Fprintf(w, " Data ex. method : Ethernet\n")
	}
	fmt.Fprintln(w, resultLine)
	if o.PostList > 1 {
		fmt.Fprintln(w, "Post List requested - CQ moderation will be the size of the post list")
	}
	if !timed && !sh.lat && o.Iters > noPeakIters && !o.NoPeak {
		fmt.Fprintln(w, " WARNING: BW peak won't be measured in this run.")
	}
}

// rxDepthShown is the rx depth perftest prints: -r, at most the iterations, and one more when odd in
// a single-size counted run (its "WA for a bug when rx_depth is odd in SEND").
func (p *peer) rxDepthShown(timed bool) int {
	d := p.o.RxDepth
	if !timed {
		d = min(d, p.o.Iters)
		if d%2 == 1 && !p.o.All {
			d++
		}
	}
	return d
}

// printDest prints ctx_print_pingpong_data: the address line (with the outstanding reads of a READ
// test, and the key and address of a WRITE or READ test) and the GID in decimal bytes.
func (p *peer) printDest(w io.Writer, side string, d Dest) {
	fmt.Fprintf(w, " %s address: LID %s QPN %s PSN %s", side, cAltHex(uint64(d.LID), 4), cAltHex(uint64(d.QPN), 6), cAltHex(uint64(d.PSN), 6))
	switch p.sh.verb {
	case Read:
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

// printBWHeader prints the bandwidth table's header in the unit of the report.
func (o *Options) printBWHeader(w io.Writer) {
	if o.ReportGbits {
		fmt.Fprint(w, bwHeaderG)
	} else {
		fmt.Fprint(w, bwHeader)
	}
}

// printBW prints a bandwidth result line (REPORT_FMT, or REPORT_FMT_EXT for averages below 0.1
// Gbit/s, which need the digits).
func (o *Options) printBW(w io.Writer, r BWReport) {
	if o.ReportGbits && r.BWAvg < 0.1 {
		fmt.Fprintf(w, " %-7d    %d           %-7.6f            %-7.6f            %-7.6f\n", r.Size, r.Iters, r.BWPeak, r.BWAvg, r.MsgRate)
		return
	}
	fmt.Fprintf(w, " %-7d    %-10d       %-7.2f            %-7.2f\t\t   %-7.6f\n", r.Size, r.Iters, r.BWPeak, r.BWAvg, r.MsgRate)
}

// printLat prints a latency result line (REPORT_FMT_LAT).
func printLat(w io.Writer, l LatReport) {
	fmt.Fprintf(w, " %-7d %d          %-7.2f        %-7.2f      %-7.2f  \t       %-7.2f     \t%-7.2f\t\t%-7.2f \t\t%-7.2f\n",
		l.Size, l.Iters, l.Min, l.Max, l.Typical, l.Avg, l.Stdev, l.Percentile99, l.Percentile999)
}

// printLatDur prints a Duration run's latency line (REPORT_FMT_LAT_DUR).
func printLatDur(w io.Writer, l LatReport) {
	fmt.Fprintf(w, " %-7d       %d            %-7.2f        %-7.2f\n", l.Size, l.Iters, l.Avg, l.TPS)
}

// printHistogram prints every sample as print_report_lat does with -U (in the order taken) and -H
// (sorted): "#, usec", then "i, latency".
func (o *Options) printHistogram(w io.Writer, samples []time.Duration) {
	us := usec(samples)
	if o.Unsorted {
		fmt.Fprintln(w, "#, usec")
		for i, v := range us {
			fmt.Fprintf(w, "%d, %s\n", i+1, cG(v))
		}
	}
	slices.Sort(us)
	if o.Histogram || o.Unsorted {
		fmt.Fprintln(w, "#, usec")
		for i, v := range us {
			fmt.Fprintf(w, "%d, %s\n", i+1, cG(v))
		}
	}
}
