package explain

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/goroce/goroce/wire"
)

// Kind classifies a Note, for the viewer's colors and filters.
type Kind uint8

// Note kinds.
const (
	KindInfo       Kind = iota // what the packet is for: the READ it answers, the responses a READ asks for
	KindFate                   // what befell it on the way, from the capture's comments: lost, dropped, copied
	KindNAK                    // a NAK and why the responder sent it
	KindRetransmit             // a request sent again, and what set it off
	KindDuplicate              // a duplicate request answered again, or a copy the network made
	KindAck                    // what an ACK acknowledges: coalescing, the MSN
	KindCongestion             // ECN CE marks and CNPs
	KindError                  // a NAK for a remote error: access, invalid request, operational
)

var kindNames = [...]string{
	KindInfo: "info", KindFate: "fate", KindNAK: "nak", KindRetransmit: "retransmit", KindDuplicate: "duplicate",
	KindAck: "ack", KindCongestion: "congestion", KindError: "error",
}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// Note is one sentence about one packet.
type Note struct {
	Kind     Kind
	Text     string
	Inferred bool  // reasoned from the capture, not read from a field or a comment of it
	Refs     []int // the frames the text names ("#12"), in order
}

// Role is what a packet does in its queue pair's conversation.
type Role uint8

// Roles.
const (
	RoleRequest  Role = iota // a request, or a UC or UD packet
	RoleResponse             // an ACK, a NAK, a READ response or an atomic ACK
	RoleCNP                  // a congestion notification
)

func (r Role) String() string {
	switch r {
	case RoleResponse:
		return "response"
	case RoleCNP:
		return "CNP"
	}
	return "request"
}

// Endpoint is one queue pair: the address it sends from and its QPN.
type Endpoint struct {
	ID    int // its index in Analysis.Endpoints
	Addr  netip.Addr
	QPN   wire.QPN
	Known bool // false when no packet of the capture names its QPN
}

// String names the endpoint: "10.0.0.1 QP 0x000011", or "10.0.0.1 QP ?" when its QPN is not known.
func (e *Endpoint) String() string {
	if !e.Known {
		return e.Addr.String() + " QP ?"
	}
	return e.Addr.String() + " QP " + e.QPN.String()
}

// Pair is the conversation of two queue pairs: every packet between them, both ways.
type Pair struct {
	ID        int       // from 1, in the order the pairs first appear
	A, B      *Endpoint // A sent the pair's first packet
	Transport wire.Transport
	Inferred  bool  // the endpoints were matched by a weaker guess than matching PSNs, or one is unknown
	Frames    []int // the frames of its packets, in capture order
	Stats     Stats
	Story     []string // the pair's story, a sentence each
}

// String names the pair: "RC 10.0.0.1 QP 0x000011 <-> 10.0.0.2 QP 0x000012".
func (p *Pair) String() string {
	return p.Transport.String() + " " + p.A.String() + " <-> " + p.B.String()
}

// Stats counts what happened in a pair. The counts of causes are inferences.
type Stats struct {
	Packets, Requests, Responses, CNPs int
	Start, End                         time.Time // the first and the last packet
	Messages                           int       // messages the requester sent (last or only packets sent the first time)
	Lost, Dropped, Marked, Copied      int       // what the capture's comments say befell packets
	Retransmits                        int       // request packets sent again
	AfterTimeout, AfterNAK, AfterRNR   int       // retransmissions that began a resend, by what set them off
	Probes                             int       // tail-loss probes: the last packet again, with AckReq (from the sender's trace)
	Traced                             int       // retransmissions whose cause the sender's trace gave ("resent:" comments), not inferred
	AfterReadGap                       int       // READ requests sent again after a gap in their responses
	InBurst                            int       // retransmissions that continue a resend (go-back-N)
	ACKs, NAKs, RNRNAKs, ErrorNAKs     int
	MaxCoalesced                       int  // the most request packets one ACK acknowledged at once
	Duplicates                         int  // responses sent again for duplicate requests
	AckOnReadAtomic                    int  // plain ACKs with a READ's or atomic's last PSN, which rxe takes for their completion
	MSN                                int  // the last MSN seen, or -1
	PSNGaps                            int  // UC: gaps in the PSN sequence, messages the receiver drops
	Malformed                          int  // packets that did not decode whole
	Bidirectional                      bool // both endpoints sent requests
}

// Explanation is what Analyze says about one packet.
type Explanation struct {
	Frame    int
	From, To *Endpoint
	Pair     *Pair
	Role     Role
	Notes    []Note
}

// Analysis is the story of a capture: its queue pairs and a note or more on each packet that needs one.
type Analysis struct {
	Pairs     []*Pair
	Endpoints []*Endpoint
	Packets   []Explanation // one per packet given to Analyze, in its order
	CM        []*CMConn     // the connection manager's connections, from the MADs on QP1
	byFrame   map[int]int
}

// Frame returns the explanation of the packet with that frame number, or nil.
func (a *Analysis) Frame(n int) *Explanation {
	if i, ok := a.byFrame[n]; ok {
		return &a.Packets[i]
	}
	return nil
}

// Analyze tells the story of the RoCEv2 packets of one capture, given in capture order. It keeps no
// reference to pkts' data.
func Analyze(pkts []Packet) *Analysis {
	a := &Analysis{Packets: make([]Explanation, len(pkts)), byFrame: make(map[int]int, len(pkts))}
	ps := make([]*pkt, len(pkts))
	for i := range pkts {
		a.Packets[i].Frame = pkts[i].Frame
		a.byFrame[pkts[i].Frame] = i
		ps[i] = decode(&pkts[i], &a.Packets[i])
	}
	a.pairUp(ps)
	for _, p := range ps {
		if p.ex.Pair != nil {
			count(p)
		}
	}
	for _, c := range a.channels(ps) {
		c.run()
	}
	a.analyzeCM(ps)
	for _, p := range ps {
		p.fateNotes()
		p.ex.Notes = p.notes
	}
	for _, pr := range a.Pairs {
		pr.Story = story(pr)
	}
	return a
}

// count counts p in its pair's Stats.
func count(p *pkt) {
	pr := p.ex.Pair
	st := &pr.Stats
	if st.Packets == 0 {
		st.Start = p.in.At
	}
	st.Packets++
	st.End = p.in.At
	switch p.role {
	case RoleRequest:
		st.Requests++
	case RoleResponse:
		st.Responses++
	case RoleCNP:
		st.CNPs++
	}
	switch {
	case p.copied:
		st.Copied++
	case strings.HasPrefix(p.lost, "lost"):
		st.Lost++
	case p.lost != "":
		st.Dropped++
	}
	if p.ce {
		st.Marked++
	}
	if p.err != "" {
		st.Malformed++
	}
	if p.role == RoleRequest && p.ex.From != pr.A {
		st.Bidirectional = true
	}
}

// pkt is a packet being analyzed: its decoded headers and what the capture says befell it.
type pkt struct {
	in      *Packet
	ex      *Explanation
	ok      bool   // the BTH decoded
	err     string // why the packet did not decode whole, if it did not
	bth     wire.BTHFields
	info    *wire.OpInfo
	aeth    bool
	syn     wire.Syndrome
	msn     wire.MSN
	reth    bool
	va      uint64
	dmaLen  uint32
	deth    bool
	srcQP   wire.QPN
	payload int
	madData []byte // a UD packet's payload: a MAD when it goes to QP1
	role    Role

	lost   string // the comment saying the receiver never got it (lost, dropped or corrupted on the way)
	resent string // what set a resend off, from the sender's own trace (its "resent:" comment)
	copied bool   // a copy the network made
	ce     bool   // marked CE on the way, or captured with CE
	notes  []Note
	fates  []Note // notes from the capture's comments, put first
}

func decode(in *Packet, ex *Explanation) *pkt {
	p := &pkt{in: in, ex: ex}
	wp, err := wire.Parse(in.Data)
	if err == nil {
		f := wp.Fields()
		p.ok = true
		p.bth = f.BTH
		p.info = wp.Info()
		p.payload = wp.PayloadLen()
		p.aeth = wp.Has(wire.HdrAETH)
		p.syn, p.msn = f.AETH.Syndrome, f.AETH.MSN
		p.reth = wp.Has(wire.HdrRETH)
		p.va, p.dmaLen = f.RETH.VA, f.RETH.DMALen
		if wp.Has(wire.HdrAtomicETH) {
			p.va = f.AtomicETH.VA
		}
		p.deth = wp.Has(wire.HdrDETH)
		p.srcQP = f.DETH.SrcQP
		if p.deth && p.bth.DestQP == gsiQPN {
			p.madData = wp.Payload()
		}
	} else if len(in.Data) >= wire.BTHLen {
		p.ok = true
		p.err = err.Error()
		p.bth = wire.BTH(in.Data[:wire.BTHLen]).Fields()
		p.info = p.bth.Opcode.Info()
		if !p.info.Valid() {
			p.ok = false
		}
	} else {
		p.err = "shorter than a BTH"
	}
	if p.ok {
		switch {
		case p.info.Transport == wire.TransportCNP:
			p.role = RoleCNP
		case p.info.Response:
			p.role = RoleResponse
		}
	}
	ex.Role = p.role
	p.ce = in.ECN == 3
	for _, c := range in.Comments {
		verb, rest, _ := strings.Cut(c, ":")
		rest = strings.TrimSpace(rest)
		switch verb {
		case "lost":
			p.lost = c
			p.fate(KindFate, "lost on the way (%s): the receiver never got it", rest)
		case "dropped":
			p.lost = c
			p.fate(KindFate, "the receiver dropped it (%s)", rest)
		case "corrupted":
			p.lost = c
			p.fate(KindFate, "corrupted on the way (%s): its ICRC no longer verifies, so the receiver drops it", rest)
		case "marked":
			p.ce = true
			p.fate(KindCongestion, "a switch marked it (%s): congestion experienced, which the receiver answers with a CNP", rest)
		case "duplicate":
			p.copied = true
			p.fate(KindFate, "the network delivered it twice (%s)", rest)
		case "resent":
			p.resent = rest // explained with the retransmission, not as a fate
		default:
			p.fate(KindInfo, "capture comment: %s", c)
		}
	}
	if p.ce && !strings.Contains(strings.Join(in.Comments, ""), "marked") {
		p.fate(KindCongestion, "captured with ECN CE (congestion experienced): a switch on the way is congested")
	}
	if p.err != "" {
		p.fate(KindError, "did not decode whole: %s", p.err)
	}
	return p
}

// arrived reports whether the receiver got the packet, as far as the capture says.
func (p *pkt) arrived() bool { return p.lost == "" }

// frame is the packet's frame number.
func (p *pkt) frame() int { return p.in.Frame }

func (p *pkt) fate(k Kind, format string, args ...any) {
	p.fates = append(p.fates, newNote(k, false, format, args...))
}

// note adds a note; its Refs are the "#N" it names.
func (p *pkt) note(k Kind, inferred bool, format string, args ...any) {
	p.notes = append(p.notes, newNote(k, inferred, format, args...))
}

func (p *pkt) fateNotes() {
	if len(p.fates) > 0 {
		p.notes = append(p.fates, p.notes...)
	}
}

func newNote(k Kind, inferred bool, format string, args ...any) Note {
	n := Note{Kind: k, Text: fmt.Sprintf(format, args...), Inferred: inferred}
	s := n.Text
	for {
		i := strings.IndexByte(s, '#')
		if i < 0 {
			break
		}
		s = s[i+1:]
		j := 0
		for j < len(s) && s[j] >= '0' && s[j] <= '9' {
			j++
		}
		if v, err := strconv.Atoi(s[:j]); err == nil && !slices.Contains(n.Refs, v) {
			n.Refs = append(n.Refs, v)
		}
		s = s[j:]
	}
	return n
}

// fmtDur writes a duration the way the notes do: microseconds below 1 ms, then milliseconds, then seconds.
func fmtDur(d time.Duration) string {
	us := float64(d) / float64(time.Microsecond)
	switch {
	case us < 10:
		return strconv.FormatFloat(us, 'f', 2, 64) + " us"
	case us < 1000:
		return strconv.FormatFloat(us, 'f', 1, 64) + " us"
	case us < 1e6:
		return strconv.FormatFloat(us/1000, 'f', 3, 64) + " ms"
	}
	return strconv.FormatFloat(us/1e6, 'f', 3, 64) + " s"
}

// plural returns "1 packet" or "2 packets".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}
