package sim

import (
	"fmt"
	"io"
	"sort"
	"strconv"
)

// Recorder samples a run at a fixed interval: the rate at which each flow's payload arrives, and the
// occupancy, marks and drops of the watched ports.
type Recorder struct {
	Interval Time
	Times    []Time
	Flows    []*Flow
	FlowRate [][]float64 // [flow][sample] payload arriving, bits per second, over the last interval
	Ports    []*Port
	Queue    [][]int    // [port][sample] output queue bytes at the sample instant
	Marks    [][]uint64 // [port][sample] CE marks so far
	Drops    [][]uint64 // [port][sample] queue-full drops so far
	Paused   [][]Time   // [port][sample] time the port has spent paused by PFC so far
	// CCRate is [flow][sample] the requester's DCQCN rate (Endpoint.Rate), bits per second; nil when
	// no recorded flow runs DCQCN.
	CCRate [][]float64

	last []uint64
}

// Record starts sampling every interval until the run ends. Flows are those added so far; add flows
// before calling it.
func (s *Sim) Record(interval Time, ports []*Port) *Recorder {
	r := &Recorder{Interval: interval, Flows: append([]*Flow(nil), s.flows...), Ports: ports}
	r.FlowRate = make([][]float64, len(r.Flows))
	r.last = make([]uint64, len(r.Flows))
	r.Queue = make([][]int, len(ports))
	r.Marks = make([][]uint64, len(ports))
	r.Drops = make([][]uint64, len(ports))
	r.Paused = make([][]Time, len(ports))
	for _, f := range r.Flows {
		if f.Req.RP != nil {
			r.CCRate = make([][]float64, len(r.Flows))
			break
		}
	}
	s.Every(s.now, interval, func(now Time) bool {
		r.sample(now)
		return true
	})
	return r
}

func (r *Recorder) sample(now Time) {
	r.Times = append(r.Times, now)
	for i, f := range r.Flows {
		b := f.DataEndpoint().Stats.RxPayload
		rate := 0.0
		if len(r.Times) > 1 {
			rate = float64(b-r.last[i]) * 8 / r.Interval.Seconds()
		}
		r.last[i] = b
		r.FlowRate[i] = append(r.FlowRate[i], rate)
		if r.CCRate != nil {
			r.CCRate[i] = append(r.CCRate[i], f.Req.Rate(now))
		}
	}
	for i, p := range r.Ports {
		r.Queue[i] = append(r.Queue[i], p.qbytes)
		r.Marks[i] = append(r.Marks[i], p.Stats.Marks)
		r.Drops[i] = append(r.Drops[i], p.Stats.Drops[DropQueueFull])
		r.Paused[i] = append(r.Paused[i], p.PausedFor(now))
	}
}

// WriteCSV writes one row per sample: time in microseconds, each flow's rate in Gb/s (and its DCQCN
// rate, if any), and each port's queue (bytes), marks, drops and paused time so far (microseconds).
func (r *Recorder) WriteCSV(w io.Writer) error {
	b := []byte("time_us")
	for _, f := range r.Flows {
		b = append(b, ","+f.Spec.Name+"_gbps"...)
	}
	if r.CCRate != nil {
		for _, f := range r.Flows {
			b = append(b, ","+f.Spec.Name+"_dcqcn_gbps"...)
		}
	}
	for _, p := range r.Ports {
		b = append(b, fmt.Sprintf(",%s_queue_bytes,%s_marks,%s_drops,%s_paused_us", p.Name, p.Name, p.Name, p.Name)...)
	}
	b = append(b, '\n')
	for k, t := range r.Times {
		b = strconv.AppendFloat(b, float64(t)/float64(Microsecond), 'f', 3, 64)
		for i := range r.Flows {
			b = append(b, ',')
			b = strconv.AppendFloat(b, r.FlowRate[i][k]/1e9, 'f', 4, 64)
		}
		if r.CCRate != nil {
			for i := range r.Flows {
				b = append(b, ',')
				b = strconv.AppendFloat(b, r.CCRate[i][k]/1e9, 'f', 4, 64)
			}
		}
		for i := range r.Ports {
			b = append(b, ',')
			b = strconv.AppendInt(b, int64(r.Queue[i][k]), 10)
			b = append(b, ',')
			b = strconv.AppendUint(b, r.Marks[i][k], 10)
			b = append(b, ',')
			b = strconv.AppendUint(b, r.Drops[i][k], 10)
			b = append(b, ',')
			b = strconv.AppendFloat(b, float64(r.Paused[i][k])/float64(Microsecond), 'f', 3, 64)
		}
		b = append(b, '\n')
	}
	_, err := w.Write(b)
	return err
}

// FlowRow is one line of a flow summary.
type FlowRow struct {
	Name        string
	Op          Op
	Src, Dst    string
	Size        int64
	Start       Time
	FCT         Time // 0 if it did not finish
	GoodputGbps float64
	Completed   int64
	Retransmits uint64
	Timeouts    uint64
	NAKs        uint64 // PSN sequence error NAKs the requester received
	CNPs        uint64
	Status      string
}

// Summary returns a row per flow, as of the current time.
func (s *Sim) Summary() []FlowRow {
	var rows []FlowRow
	for _, f := range s.flows {
		c := f.Req.QP.Counters()
		st := "running"
		switch {
		case f.Stats.Err != 0:
			st = f.Stats.Err.String()
		case f.Stats.Finish != 0:
			st = "done"
		}
		rows = append(rows, FlowRow{Name: f.Spec.Name, Op: f.Spec.Op, Src: f.Spec.Src.Name, Dst: f.Spec.Dst.Name,
			Size: f.Spec.Size, Start: f.Spec.Start, FCT: f.FCT(), GoodputGbps: f.Goodput(s.now) / 1e9,
			Completed: f.Stats.Completed, Retransmits: f.Req.Stats.Retransmits, Timeouts: c.Timeouts,
			NAKs: c.RcvdSeqErr, CNPs: f.Req.Stats.CNPsRcvd, Status: st})
	}
	return rows
}

// WriteSummary prints the flow summary as an aligned table.
func WriteSummary(w io.Writer, rows []FlowRow) {
	fmt.Fprintf(w, "%-8s %-5s %-7s %-7s %10s %10s %12s %9s %8s %6s %6s %6s  %s\n",
		"flow", "op", "src", "dst", "size", "start", "fct", "goodput", "retx", "tmo", "naks", "cnps", "status")
	for _, r := range rows {
		size := "inf"
		if r.Size > 0 {
			size = humanBytes(r.Size)
		}
		fct := "-"
		if r.FCT > 0 {
			fct = r.FCT.Duration().String()
		}
		fmt.Fprintf(w, "%-8s %-5s %-7s %-7s %10s %10v %12s %7.2fG %8d %6d %6d %6d  %s\n",
			r.Name, r.Op, r.Src, r.Dst, size, r.Start.Duration(), fct, r.GoodputGbps, r.Retransmits, r.Timeouts,
			r.NAKs, r.CNPs, r.Status)
	}
}

// WriteSummaryCSV writes the flow summary as CSV.
func WriteSummaryCSV(w io.Writer, rows []FlowRow) error {
	if _, err := fmt.Fprintln(w, "flow,op,src,dst,size_bytes,start_us,fct_us,goodput_gbps,completed_bytes,retransmits,timeouts,naks,cnps,status"); err != nil {
		return err
	}
	for _, r := range rows {
		if _, err := fmt.Fprintf(w, "%s,%s,%s,%s,%d,%.3f,%.3f,%.4f,%d,%d,%d,%d,%d,%s\n", r.Name, r.Op, r.Src, r.Dst, r.Size,
			float64(r.Start)/float64(Microsecond), float64(r.FCT)/float64(Microsecond), r.GoodputGbps, r.Completed,
			r.Retransmits, r.Timeouts, r.NAKs, r.CNPs, r.Status); err != nil {
			return err
		}
	}
	return nil
}

// PortRow is one line of a port summary.
type PortRow struct {
	Name                      string
	TxPackets, TxBytes        uint64
	MaxQueue                  int
	Marks                     uint64
	Drops                     [numDropReasons]uint64
	Corrupted, Dup, Reordered uint64
	PausesSent                uint64
	PausedTime                Time
}

// WritePorts prints the ports that carried traffic.
func WritePorts(w io.Writer, ports []*Port) {
	fmt.Fprintf(w, "%-16s %10s %10s %10s %8s %8s %8s %8s %8s\n", "port", "tx_pkts", "tx_bytes", "max_queue", "marks", "qdrops", "lost", "pauses", "paused")
	for _, p := range ports {
		st := &p.Stats
		if st.TxPackets == 0 {
			continue
		}
		fmt.Fprintf(w, "%-16s %10d %10s %10s %8d %8d %8d %8d %8v\n", p.Name, st.TxPackets, humanBytes(int64(st.TxBytes)),
			humanBytes(int64(st.MaxQueue)), st.Marks, st.Drops[DropQueueFull], st.Drops[DropLoss]+st.Drops[DropLinkDown],
			st.PausesSent, st.PausedTime.Duration())
	}
}

func humanBytes(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20:
		return fmt.Sprintf("%.1fMiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1fKiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}

// keepBusiest drops all but the n ports that sent the most bytes, busiest first.
func (r *Recorder) keepBusiest(n int) {
	idx := make([]int, len(r.Ports))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return r.Ports[idx[a]].Stats.TxBytes > r.Ports[idx[b]].Stats.TxBytes })
	idx = idx[:min(n, len(idx))]
	var ports []*Port
	var q [][]int
	var m, d [][]uint64
	var pt [][]Time
	for _, i := range idx {
		ports, q, m, d = append(ports, r.Ports[i]), append(q, r.Queue[i]), append(m, r.Marks[i]), append(d, r.Drops[i])
		pt = append(pt, r.Paused[i])
	}
	r.Ports, r.Queue, r.Marks, r.Drops, r.Paused = ports, q, m, d, pt
}
