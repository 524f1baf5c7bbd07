package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

	"github.com/goroce/goroce/interop/capture"
	"github.com/goroce/goroce/interop/capture/explain"
	_ "github.com/goroce/goroce/wire/iblayer" // registers the RoCEv2 layers on UDP port 4791
)

const dumpUsage = `usage: goroce dump [-v] [-qp] [-explain] FILE.pcap...

Decodes RoCEv2 captures (pcap or pcapng; Ethernet, Linux cooked or raw IP; IPv4 and IPv6): one line per
packet with the InfiniBand transport headers in words and the ICRC checked, the management datagrams
(RDMA CM) sent to QP1, the TCP out-of-band exchange of ibv_rc_pingpong and perftest on port 18515, then a
summary per QP flow. A pcapng packet's comments end its line in brackets: goroce's own captures (-w)
say there what befell a packet, "[lost: injected loss]", "[dropped: bad ICRC]". Exits 0 when every
RoCEv2 packet decoded whole and its ICRC verified, 1 otherwise.

-explain tells each queue pair's story from the wire: under a packet, why a NAK was sent (the PSN the
responder expected and the one it got), which packet a retransmission repeats and what set it off (a
NAK, a timeout, an RNR NAK's wait, a gap in READ responses), which duplicates a responder answered
again, which requests one ACK covers, how the MSN advances, what a CNP answers; after the summary, the
story of each pair. Lines marked [inferred] are reasoned from the packets, not read from them.

flags:
`

// dumpOptions are the flags of goroce dump.
type dumpOptions struct {
	verbose bool // a field tree under each packet
	qpOnly  bool // only the per-QP summaries, no packet lines
	explain bool // notes under the packets and a story per queue pair
	keep    bool // keep every file's packets, trees and analysis in dumper.kept, for the viewer
}

func runDump(args []string) error {
	fs := flag.NewFlagSet("dump", flag.ContinueOnError)
	var o dumpOptions
	fs.BoolVar(&o.verbose, "v", false, "print every header field of every packet")
	fs.BoolVar(&o.qpOnly, "qp", false, "print only the per-QP flow summaries, not the packets")
	fs.BoolVar(&o.explain, "explain", false, "explain the packets: NAKs, retransmissions, duplicates, ACK coalescing, MSN, CNPs; and tell each queue pair's story")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), dumpUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return errUsage
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errUsage
	}
	w := bufio.NewWriterSize(os.Stdout, 64<<10)
	_, ok := dump(w, o, fs.Args()...)
	if err := w.Flush(); err != nil {
		return err
	}
	if !ok {
		return exitError(1)
	}
	return nil
}

// dump decodes the capture files, writes the report to w, and returns the totals and whether every
// RoCEv2 packet decoded whole and verified and every file was read to its end.
func dump(w io.Writer, o dumpOptions, files ...string) (counts, bool) {
	d := newDumper(w, o)
	readOK := true
	for _, f := range files {
		if err := d.dumpFile(f); err != nil {
			readOK = false
			fmt.Fprintf(w, "%s: %v\n", f, err)
		}
	}
	ok := d.finish()
	if !readOK {
		fmt.Fprintln(w, "FAIL: not every capture file could be read")
	}
	return d.total, ok && readOK
}

// dumper decodes captures and writes what it sees. It is not safe for concurrent use.
type dumper struct {
	w        io.Writer
	opts     dumpOptions
	cur      *captureFile // the file being read
	total    counts       // over all files
	files    int
	note     string   // the comments of the packet being decoded, joined
	comments []string // and one by one

	// With -explain or keep, a file's packets wait in held until the file is read and analyzed.
	held []*heldPacket
	kept []*keptFile // with keep: every file read
}

// heldPacket is a packet decoded and waiting for its file's analysis.
type heldPacket struct {
	n    int
	at   time.Duration // since the file's first packet
	line string        // its dump line, without the newline
	tree string        // its -v field tree, lines ending in newlines
	roce *explain.Packet
}

// keptFile is what the dumper kept of one file for the viewer.
type keptFile struct {
	name     string
	packets  []*heldPacket
	analysis *explain.Analysis
	summary  string // the summary dump prints after the packets
	counts   counts
}

func newDumper(w io.Writer, o dumpOptions) *dumper { return &dumper{w: w, opts: o} }

// captureFile is the state of one capture file: its clock origin, flows and TCP streams.
type captureFile struct {
	name   string
	start  time.Time
	counts counts
	flows  flowTable
	tcp    map[tcpKey]uint32 // first sequence number seen per direction, for relative numbers
}

// counts are what the dump tallies, per file and in total.
type counts struct {
	packets   int
	roce      int // UDP to port 4791
	icrcOK    int
	icrcBad   int
	malformed int // RoCEv2 packets wire rejects
	truncated int // RoCEv2 packets the capture cut short: decoded in part, ICRC unchecked
	tcp       int
	other     int
}

func (c *counts) add(o counts) {
	c.packets += o.packets
	c.roce += o.roce
	c.icrcOK += o.icrcOK
	c.icrcBad += o.icrcBad
	c.malformed += o.malformed
	c.truncated += o.truncated
	c.tcp += o.tcp
	c.other += o.other
}

// ok reports whether every RoCEv2 packet decoded whole and verified.
func (c *counts) ok() bool { return c.icrcBad == 0 && c.malformed == 0 && c.truncated == 0 }

// packetSource is what the pcap and pcapng readers have in common.
type packetSource interface {
	ReadPacketData() ([]byte, gopacket.CaptureInfo, error)
	LinkType() layers.LinkType
}

// openCapture opens a pcap or pcapng file.
func openCapture(r io.Reader) (packetSource, string, error) {
	br := bufio.NewReaderSize(r, 256<<10)
	magic, err := br.Peek(4)
	if err != nil {
		return nil, "", fmt.Errorf("not a capture file: %w", err)
	}
	if string(magic) == "\x0a\x0d\x0d\x0a" {
		ng, err := capture.NewReader(br)
		if err != nil {
			return nil, "pcapng", err
		}
		return &ngSource{r: ng}, "pcapng", nil
	}
	pr, err := pcapgo.NewReader(br)
	return pr, "pcap", err
}

// ngSource reads pcapng files with capture.Reader, which, unlike pcapgo's reader, keeps each packet's
// comments and reads packets of every interface, whatever its link type.
type ngSource struct {
	r   *capture.Reader
	rec *capture.Record // the last packet read
}

func (s *ngSource) ReadPacketData() ([]byte, gopacket.CaptureInfo, error) {
	rec, err := s.r.Next()
	if err != nil {
		return nil, gopacket.CaptureInfo{}, err
	}
	s.rec = rec
	data := bytes.Clone(rec.Data) // the Reader reuses its buffer; callers may keep packets
	return data, gopacket.CaptureInfo{Timestamp: rec.At, CaptureLength: len(data), Length: rec.Length,
		InterfaceIndex: rec.Interface}, nil
}

// LinkType returns the link type of the file's first interface.
func (s *ngSource) LinkType() layers.LinkType { return layers.LinkType(s.r.LinkType()) }

// dumpFile decodes one capture file and prints its packets and its summary.
func (d *dumper) dumpFile(name string) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	src, format, err := openCapture(f)
	if err != nil {
		return err
	}
	if d.files > 0 {
		fmt.Fprintln(d.w)
	}
	d.files++
	fmt.Fprintf(d.w, "# %s: %s, link type %v\n", name, format, src.LinkType())
	d.cur = &captureFile{name: name, flows: newFlowTable(), tcp: map[tcpKey]uint32{}}
	var readErr error
	for n := 1; ; n++ {
		data, ci, err := src.ReadPacketData()
		if err == io.EOF {
			break
		}
		if err != nil {
			readErr = fmt.Errorf("packet %d: %w", n, err)
			break
		}
		d.note, d.comments = "", nil
		if ng, ok := src.(*ngSource); ok {
			d.comments = ng.rec.Comments
			d.note = strings.Join(d.comments, "; ")
		}
		d.packet(n, ci, data, linkDecoder(src))
	}
	d.release()
	d.total.add(d.cur.counts)
	return readErr
}

// holding reports whether packets wait for their file's analysis instead of being printed at once.
func (d *dumper) holding() bool { return d.opts.explain || d.opts.keep }

// release analyzes the file's held packets and prints them, each with its notes under -explain, then the
// summary and, under -explain, the queue pairs' stories.
func (d *dumper) release() {
	if !d.holding() {
		d.summary()
		return
	}
	var pkts []explain.Packet
	for _, h := range d.held {
		if h.roce != nil {
			pkts = append(pkts, *h.roce)
		}
	}
	a := explain.Analyze(pkts)
	if !d.opts.qpOnly {
		for _, h := range d.held {
			fmt.Fprintln(d.w, h.line)
			if d.opts.verbose {
				fmt.Fprint(d.w, h.tree)
			}
			if d.opts.explain {
				if e := a.Frame(h.n); e != nil {
					writeNotes(d.w, e.Notes)
				}
			}
		}
	}
	var sum bytes.Buffer
	w := d.w
	d.w = io.MultiWriter(w, &sum)
	d.summary()
	d.w = w
	if d.opts.explain {
		writeStories(d.w, d.cur.name, a)
	}
	if d.opts.keep {
		d.kept = append(d.kept, &keptFile{name: d.cur.name, packets: d.held, analysis: a, summary: sum.String(),
			counts: d.cur.counts})
	}
	d.held = nil
}

// linkDecoder returns the decoder of the link layer of the packet src read last; pcapng files name it
// per interface.
func linkDecoder(src packetSource) gopacket.Decoder {
	if ng, ok := src.(*ngSource); ok {
		return layers.LinkType(ng.rec.LinkType)
	}
	return src.LinkType()
}

// finish prints the totals, the legend and the verdict, and reports whether the verdict is OK.
func (d *dumper) finish() bool {
	t := &d.total
	w := d.w
	if d.files > 1 {
		fmt.Fprintf(w, "\nTotal over %d files: %s\n", d.files, t.line())
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, legend)
	if d.opts.explain {
		fmt.Fprintln(w, explainLegend)
	}
	switch {
	case t.roce == 0:
		fmt.Fprintln(w, "OK: no RoCEv2 packets")
	case t.ok():
		fmt.Fprintf(w, "OK: all %d RoCEv2 packets decoded and their ICRCs verified\n", t.roce)
	default:
		fmt.Fprintf(w, "FAIL: %d of %d RoCEv2 packets not verified: %d ICRC failures, %d malformed, %d truncated by the capture (ICRC not checked)\n",
			t.icrcBad+t.malformed+t.truncated, t.roce, t.icrcBad, t.malformed, t.truncated)
	}
	return t.ok()
}

// line summarizes counts in one line.
func (c *counts) line() string {
	return fmt.Sprintf("%d packets: %d RoCEv2 (%d icrc ok, %d icrc bad, %d malformed, %d truncated), %d TCP, %d other",
		c.packets, c.roce, c.icrcOK, c.icrcBad, c.malformed, c.truncated, c.tcp, c.other)
}

const legend = `Legend: qp = destination QP; psn = packet sequence number (24 bits, one per packet, its own sequence
per direction); ack-req = the requester asks for an ACK. An ACK's psn acknowledges every request up to and
including it (responders coalesce ACKs), its msn counts the messages the responder has completed. A psn
seen again in a flow is a retransmission (requests) or a duplicate (responses). icrc = the invariant CRC
over the IP, UDP and InfiniBand headers and payload, with the fields routers change masked. Opcodes are
named as Wireshark names them.`

const explainLegend = `Explained (-explain): the lines under a packet say what it means and why it was sent; #N is packet
N. [inferred] marks what is reasoned from the packets (which PSN a responder got, what set off a
resend) rather than read from a field or from the capture's comments: goroce's own trace events, which
would say why goroce did what it did, are not in captures yet.`
