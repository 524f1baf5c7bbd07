package pingpong

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"

	"github.com/goroce/goroce"
)

// DestLen is the size of the out-of-band message: "%04x:%06x:%06x:%s" with a 32-digit GID, and its NUL.
// rdma-core libibverbs/examples/rc_pingpong.c, pp_client_exch_dest (sizeof "0000:000000:000000:" plus
// 32 GID digits).
const DestLen = len("0000:000000:000000:00000000000000000000000000000000") + 1

// doneMsg is what the client writes after it has read the server's message and connected, NUL
// included; the server waits for it before the traffic starts (pp_server_exch_dest's read of "done").
const doneMsg = "done\x00"

// ErrBadDest is the error of an out-of-band message that is not a well-formed Dest. The error
// ParseDest returns quotes the message after it.
var ErrBadDest = errors.New("bad remote address")

// Dest is one side's out-of-band message: rc_pingpong's struct pingpong_dest as it travels, the text
// "%04x:%06x:%06x:%s" (LID, QPN, PSN, and the GID as 32 hex digits in wire order) followed by a NUL,
// DestLen bytes in all. rdma-core libibverbs/examples/rc_pingpong.c (pp_client_exch_dest,
// pp_server_exch_dest), and uc_pingpong.c and ud_pingpong.c alike.
//
// On RoCE the LID is 0. A peer started without -g (gid-idx) sends a zero GID; goroce then takes the
// GID from the TCP peer's address.
type Dest struct {
	LID uint16
	QPN goroce.QPN
	PSN goroce.PSN
	GID goroce.GID
}

// DestFromEndpoint returns the message that announces e: its QPN, first PSN and GID.
func DestFromEndpoint(e goroce.Endpoint) Dest {
	return Dest{QPN: e.QPN, PSN: e.PSN, GID: e.GID}
}

// Endpoint returns what d says about the peer's QP, for QP.Connect: its GID, QPN and first PSN on the
// RoCEv2 port (goroce.DefaultPort), with the MTU unknown.
func (d Dest) Endpoint() goroce.Endpoint {
	return goroce.Endpoint{GID: d.GID, QPN: d.QPN, PSN: d.PSN}
}

// Append appends d's message, NUL included (DestLen bytes), to b.
func (d Dest) Append(b []byte) []byte {
	b = fmt.Appendf(b, "%04x:%06x:%06x:%s", d.LID, uint32(d.QPN), uint32(d.PSN), d.GID.Hex())
	return append(b, 0)
}

// Marshal returns d's message, DestLen bytes.
func (d Dest) Marshal() []byte { return d.Append(make([]byte, 0, DestLen)) }

// ParseDest parses a message as rc_pingpong does (sscanf of "%x:%x:%x:%s", then wire_gid_to_gid):
// trailing NULs are ignored. Anything else is an error that matches ErrBadDest.
func ParseDest(b []byte) (Dest, error) {
	var d Dest
	s := strings.TrimRight(string(b), "\x00")
	f := strings.Split(s, ":")
	if len(f) != 4 {
		return d, fmt.Errorf("%w %q", ErrBadDest, s)
	}
	lid, err1 := strconv.ParseUint(f[0], 16, 16)
	qpn, err2 := strconv.ParseUint(f[1], 16, 24)
	psn, err3 := strconv.ParseUint(f[2], 16, 24)
	gid, ok := goroce.ParseGIDHex(f[3])
	if err := errors.Join(err1, err2, err3); err != nil || !ok {
		return d, fmt.Errorf("%w %q", ErrBadDest, s)
	}
	return Dest{LID: uint16(lid), QPN: goroce.QPN(qpn), PSN: goroce.PSN(psn), GID: gid}, nil
}

// String returns d as rc_pingpong prints an address, after "local address: " or "remote address:":
// "LID 0x0000, QPN 0x000011, PSN 0x10b60a, GID ::ffff:10.77.0.12", the GID as inet_ntop(AF_INET6)
// writes it.
func (d Dest) String() string {
	return fmt.Sprintf("LID 0x%04x, QPN 0x%06x, PSN 0x%06x, GID %s", d.LID, uint32(d.QPN), uint32(d.PSN), gidText(d.GID))
}

// gidText prints a GID as rc_pingpong does, with inet_ntop(AF_INET6).
func gidText(g goroce.GID) string { return netip.AddrFrom16(g).String() }

// line is rc_pingpong's address line: which is "local address: " or "remote address:".
func (d Dest) line(which string) string { return "  " + which + " " + d.String() }

// udLocalLine is ud_pingpong's local address line, which has a colon where the others have a comma.
func (d Dest) udLocalLine() string {
	return fmt.Sprintf("  local address:  LID 0x%04x, QPN 0x%06x, PSN 0x%06x: GID %s", d.LID, uint32(d.QPN), uint32(d.PSN), gidText(d.GID))
}

// MaxQP is the number of address messages srq_pingpong sends each way, whatever -q says (its MAX_QP):
// the Dests of its QPs, then zero Dests. rdma-core libibverbs/examples/srq_pingpong.c,
// pp_client_exch_dest and pp_server_exch_dest loop to MAX_QP (256), and rdma-core 44's
// ibv_srq_pingpong writes and reads 256 messages of DestLen bytes (checked in its binary). Its -q is
// at most MaxQP-1 ("num_qp %d must be less than %d").
const MaxQP = 256

// ExchangeClient runs the client's side of the exchange on conn, as pp_client_exch_dest and the
// client's part of main in rc_pingpong.c: it writes local, reads the server's Dest, calls connect with
// it (which brings the QP to RTR and RTS and posts the receives), and then writes "done", which tells
// the server that the first SEND may come. It returns the server's Dest.
//
// A Go test can connect its own QP to a real ibv_rc_pingpong server with it.
func ExchangeClient(conn io.ReadWriter, local Dest, connect func(remote Dest) error) (Dest, error) {
	rem, err := exchangeClient(conn, []Dest{local}, 1, func(r []Dest) error { return connect(r[0]) })
	if len(rem) == 0 {
		return Dest{}, err
	}
	return rem[0], err
}

// ExchangeServer runs the server's side of the exchange on conn, as pp_server_exch_dest: it reads the
// client's Dest, calls connect with it, so that the QP is ready before the client learns where it
// is, writes local and waits for the client's "done". It returns the client's Dest.
func ExchangeServer(conn io.ReadWriter, local Dest, connect func(remote Dest) error) (Dest, error) {
	rem, err := exchangeServer(conn, []Dest{local}, 1, func(r []Dest) error { return connect(r[0]) })
	if len(rem) == 0 {
		return Dest{}, err
	}
	return rem[0], err
}

// ExchangeSRQClient is ExchangeClient for ibv_srq_pingpong: it writes MaxQP messages, local's Dests
// (at most MaxQP) and then zero Dests, reads the server's MaxQP, calls connect with the QPs the server
// announced, and writes "done". The server's QPs are its leading messages with a QPN other than 0
// (no RC QP has QPN 0): as many as its -q. It returns them.
func ExchangeSRQClient(conn io.ReadWriter, local []Dest, connect func(remote []Dest) error) ([]Dest, error) {
	if len(local) > MaxQP {
		return nil, fmt.Errorf("%d local addresses: at most %d", len(local), MaxQP)
	}
	return exchangeClient(conn, local, MaxQP, connect)
}

// ExchangeSRQServer is ExchangeServer for ibv_srq_pingpong: it reads the client's MaxQP messages,
// calls connect with the QPs the client announced (as ExchangeSRQClient finds them), writes local's
// Dests and zero Dests up to MaxQP, and waits for "done". It returns the client's QPs.
//
// When connect fails it still answers, with MaxQP zero Dests (no QP at all), before it returns the
// error: srq_pingpong's client reads until it has all MaxQP messages and spins forever on a closed
// connection, while with zero Dests it fails at once (on RoCE its QPs cannot reach RTR without a
// GID: "Failed to modify QP[0] to RTR"). Real addresses would not do: rxe retries a retry_cnt of 7
// forever, so its QPs would send to the closed device until killed.
func ExchangeSRQServer(conn io.ReadWriter, local []Dest, connect func(remote []Dest) error) ([]Dest, error) {
	if len(local) > MaxQP {
		return nil, fmt.Errorf("%d local addresses: at most %d", len(local), MaxQP)
	}
	return exchangeServer(conn, local, MaxQP, connect)
}

// writeDests writes n messages: local's Dests, then zero Dests.
func writeDests(w io.Writer, local []Dest, n int) error {
	b := make([]byte, 0, n*DestLen)
	for i := range n {
		var d Dest
		if i < len(local) {
			d = local[i]
		}
		b = d.Append(b)
	}
	_, err := w.Write(b)
	return err
}

// readDests reads n messages.
func readDests(r io.Reader, n int) ([]byte, error) {
	b := make([]byte, n*DestLen)
	for i := range n {
		if _, err := io.ReadFull(r, b[i*DestLen:(i+1)*DestLen]); err != nil {
			if n > 1 {
				return nil, fmt.Errorf("couldn't read remote address [%d]: %w", i, err)
			}
			return nil, fmt.Errorf("couldn't read remote address: %w", err)
		}
	}
	return b, nil
}

// parseDests parses n messages. Of several, it returns those before the first with QPN 0, the QPs
// the peer announced; a single message (rc_pingpong's exchange) counts whatever it says.
func parseDests(b []byte, n int) ([]Dest, error) {
	var rem []Dest
	for i := range n {
		d, err := ParseDest(b[i*DestLen : (i+1)*DestLen])
		if err != nil {
			return rem, err
		}
		if n > 1 && d.QPN == 0 {
			break
		}
		rem = append(rem, d)
	}
	return rem, nil
}

func exchangeClient(conn io.ReadWriter, local []Dest, n int, connect func(remote []Dest) error) ([]Dest, error) {
	if err := writeDests(conn, local, n); err != nil {
		return nil, fmt.Errorf("couldn't send local address: %w", err)
	}
	b, err := readDests(conn, n)
	if err != nil {
		return nil, err
	}
	rem, err := parseDests(b, n)
	if err != nil {
		return rem, err
	}
	if err := connect(rem); err != nil {
		return rem, err
	}
	if _, err := conn.Write([]byte(doneMsg)); err != nil {
		return rem, fmt.Errorf("couldn't write done: %w", err)
	}
	return rem, nil
}

func exchangeServer(conn io.ReadWriter, local []Dest, n int, connect func(remote []Dest) error) ([]Dest, error) {
	b, err := readDests(conn, n)
	if err != nil {
		return nil, err
	}
	rem, err := parseDests(b, n)
	if err == nil {
		if err = connect(rem); err != nil && n > 1 {
			writeDests(conn, nil, n) // see ExchangeSRQServer
		}
	}
	if err != nil {
		return rem, fmt.Errorf("couldn't connect to remote QP: %w", err)
	}
	if err := writeDests(conn, local, n); err != nil {
		return rem, fmt.Errorf("couldn't send local address: %w", err)
	}
	done := make([]byte, len(doneMsg))
	if _, err := io.ReadFull(conn, done); err != nil {
		return rem, fmt.Errorf("couldn't read done: %w", err)
	}
	return rem, nil
}
