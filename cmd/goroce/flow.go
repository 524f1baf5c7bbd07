package main

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/goroce/goroce/interop/capture/explain"
	"github.com/goroce/goroce/wire"
)

// role separates the two PSN sequences that share a destination QP: the requests one side sends to the
// QP, and the responses (ACKs, READ responses, atomic ACKs) the same side returns to the QP for requests
// it received. Each has its own PSN sequence. CNPs carry no sequence.
type role uint8

const (
	roleRequest role = iota
	roleResponse
	roleCNP
)

func (r role) String() string {
	switch r {
	case roleResponse:
		return "responses"
	case roleCNP:
		return "CNPs"
	}
	return "requests"
}

func roleOf(o wire.Opcode) role {
	i := o.Info()
	switch {
	case i.Transport == wire.TransportCNP:
		return roleCNP
	case i.Valid() && i.Response:
		return roleResponse
	}
	return roleRequest
}

// flowKey names a QP flow: packets from one address to another for one destination QP, in one role.
type flowKey struct {
	src, dst netip.Addr
	qpn      wire.QPN
	role     role
}

// flow tallies one QP flow.
type flow struct {
	key       flowKey
	transport wire.Transport
	packets   int
	byOpcode  [256]int
	ackReq    int
	payload   int64
	firstPSN  wire.PSN
	lastPSN   wire.PSN // the latest PSN in serial order
	maxPSN    wire.PSN // the same, a NAK counting as the PSN before its own, for repeats
	naks      int
	rnrNaks   int
	repeats   int // packets whose PSN is not after every PSN before it
	icrcBad   int
	truncated int
}

// observe counts a packet and reports whether its PSN was seen before: a retransmitted request, or a
// duplicate response.
func (f *flow) observe(b wire.BTHFields, payload int, syn wire.Syndrome, hasAETH bool) bool {
	repeat := false
	psn, nak := b.PSN, hasAETH && syn.Kind() != wire.KindACK
	if nak {
		// A NAK names the PSN the responder expects, or the one it refused: it acknowledges the PSNs
		// before it, and is never a copy of an earlier response. IBTA Vol 1 9.7.5 (AETH syndrome).
		psn = psn.Sub(1)
	}
	if f.key.role != roleCNP {
		switch {
		case f.packets == 0:
			f.firstPSN, f.lastPSN, f.maxPSN = b.PSN, b.PSN, psn
		case psn.After(f.maxPSN):
			f.maxPSN = psn
		case !nak:
			repeat = true
			f.repeats++
		}
		if b.PSN.After(f.lastPSN) {
			f.lastPSN = b.PSN
		}
	}
	if f.packets == 0 {
		f.transport = b.Opcode.Transport()
	}
	f.packets++
	f.byOpcode[b.Opcode]++
	f.payload += int64(payload)
	if b.AckReq {
		f.ackReq++
	}
	if hasAETH {
		switch syn.Kind() {
		case wire.KindNAK:
			f.naks++
		case wire.KindRNRNAK:
			f.rnrNaks++
		}
	}
	return repeat
}

// flowTable holds the flows of a capture in the order they first appeared.
type flowTable struct {
	m     map[flowKey]*flow
	order []*flow
}

func newFlowTable() flowTable { return flowTable{m: map[flowKey]*flow{}} }

func (t *flowTable) get(k flowKey) *flow {
	f, ok := t.m[k]
	if !ok {
		f = &flow{key: k}
		t.m[k] = f
		t.order = append(t.order, f)
	}
	return f
}

// summary prints the summary of the current capture: its counts and a table of its QP flows, each with
// its packets by opcode.
func (d *dumper) summary() {
	c := d.cur
	w := d.w
	fmt.Fprintf(w, "\nSummary of %s: %s\n", c.name, c.counts.line())
	if len(c.flows.order) == 0 {
		return
	}
	width := len("src > dst")
	for _, f := range c.flows.order {
		width = max(width, len(f.key.src.String())+len(f.key.dst.String())+3)
	}
	fmt.Fprintf(w, "  %-*s  %-8s  %-12s %7s %10s  %-17s %4s %4s %7s %8s\n", width, "src > dst", "dest qp", "flow",
		"packets", "payload", "psn range", "NAK", "RNR", "repeats", "icrc bad")
	for _, f := range c.flows.order {
		k := f.key
		psns := "-"
		if k.role != roleCNP {
			psns = fmt.Sprintf("%v..%v", f.firstPSN, f.lastPSN)
		}
		fmt.Fprintf(w, "  %-*s  %-8v  %-12s %7d %10d  %-17s %4d %4d %7d %8d\n", width,
			k.src.String()+" > "+k.dst.String(), k.qpn, f.transport.String()+" "+k.role.String(), f.packets,
			f.payload, psns, f.naks, f.rnrNaks, f.repeats, f.icrcBad)
		var ops []string
		for op, n := range f.byOpcode {
			if n > 0 {
				// Wireshark's name without the transport, which the flow column shows.
				name := explain.OpcodeName(wire.Opcode(op))
				if t := wire.Opcode(op).Transport(); t != wire.TransportCNP && wire.Opcode(op).Valid() {
					name = strings.TrimPrefix(name, t.String()+" ")
				}
				ops = append(ops, fmt.Sprintf("%s %d", name, n))
			}
		}
		extra := ""
		if f.ackReq > 0 {
			extra = fmt.Sprintf("; %d ack-req", f.ackReq)
		}
		if f.truncated > 0 {
			extra += fmt.Sprintf("; %d truncated", f.truncated)
		}
		fmt.Fprintf(w, "  %*s  %s%s\n", width, "", strings.Join(ops, ", "), extra)
	}
}
