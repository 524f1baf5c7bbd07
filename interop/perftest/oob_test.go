package perftest

import (
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/goroce/goroce"
)

// A key message ib_write_bw -x 1 sent in the rxe-lab capture write_bw_oob.pcap.
const goldenKey = "0000:0001:000012:f73ab6:000003cd:0000562c8ac9c000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:4d:00:0c:00000000:"

func TestKeyMessage(t *testing.T) {
	b := make([]byte, KeyLen)
	copy(b, goldenKey)
	d, err := ParseDest(b)
	if err != nil {
		t.Fatal(err)
	}
	want := Dest{OutReads: 1, QPN: 0x12, PSN: 0xf73ab6, RKey: 0x3cd, VAddr: 0x562c8ac9c000,
		GID: goroce.GIDFromAddr(netip.MustParseAddr("::ffff:10.77.0.12"))}
	if d != want {
		t.Fatalf("parsed %+v, want %+v", d, want)
	}
	if got := d.Marshal(); string(got) != string(b) {
		t.Fatalf("Marshal = %q, want %q", got, b)
	}
	if got := d.Append([]byte("x")); string(got) != "x"+string(b) {
		t.Fatalf("Append = %q", got)
	}
	if e := d.Endpoint(); e.QPN != d.QPN || e.PSN != d.PSN || e.GID != d.GID {
		t.Errorf("Endpoint = %+v", e)
	}
	for _, bad := range []string{"", goldenKey[:40], "zz" + goldenKey[2:], goldenKey[:10] + "1" + goldenKey[10:] /* a QPN of 25 bits */} {
		if _, err := ParseDest([]byte(bad)); !errors.Is(err, ErrBadKey) {
			t.Errorf("ParseDest(%q) = %v, want ErrBadKey", bad, err)
		}
	}
}

func TestVersionAtLeast(t *testing.T) {
	for _, c := range []struct {
		v, min string
		want   bool
	}{{"6.06", "5.32", true}, {"5.31", "5.32", false}, {"5.4", "5.31", false}, {"5.1", "5.1", true}, {"6.06", "5.33", true}} {
		if got := versionAtLeast(c.v, c.min); got != c.want {
			t.Errorf("versionAtLeast(%q, %q) = %v", c.v, c.min, got)
		}
	}
}

func TestCAltHex(t *testing.T) {
	// As perftest prints them: "LID 0000 QPN 0x0011 PSN 0x7ce18e RKey 0x00021c VAddr 0x0055e66e476000".
	for _, c := range []struct {
		v     uint64
		width int
		want  string
	}{{0, 4, "0000"}, {0x11, 6, "0x0011"}, {0x7ce18e, 6, "0x7ce18e"}, {0x21c, 8, "0x00021c"}, {0x55e66e476000, 16, "0x0055e66e476000"}} {
		if got := cAltHex(c.v, c.width); got != c.want {
			t.Errorf("cAltHex(%#x, %d) = %q, want %q", c.v, c.width, got, c.want)
		}
	}
}

// TestConn runs both sides of the exchange over a pipe: hello (versions, system data, MTU), a key
// handshake, the reports and "done", each side getting the other's values.
func TestConn(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	cli, srv := NewConn(a, true), NewConn(b, false)
	cd := Dest{OutReads: 16, QPN: 0x11, PSN: 0x123456, RKey: 0x1234, VAddr: 0xdead000, GID: goroce.GIDFromAddr(netip.MustParseAddr("127.0.0.2"))}
	sd := Dest{OutReads: 128, QPN: 0x12, PSN: 0xabcdef, RKey: 0x4321, VAddr: 0xbeef000, GID: goroce.GIDFromAddr(netip.MustParseAddr("127.0.0.1"))}
	crep := BWReport{Size: 65536, Iters: 5000, BWPeak: 1234.5, BWAvg: 1000.25, MsgRate: 0.016}
	type sideResult struct {
		h   Hello
		d   Dest
		r   BWReport
		err error
	}
	done := make(chan sideResult, 1)
	go func() {
		var s sideResult
		if s.h, s.err = srv.Hello(4096, goroce.MTU4096); s.err != nil {
			done <- s
			return
		}
		if s.d, s.err = srv.Handshake(sd); s.err != nil {
			done <- s
			return
		}
		s.r, s.err = srv.ExchangeReports(BWReport{}, s.h.RemoteVersion)
		done <- s
		// The server does not read the client's "done"; drain it so that the pipe's write returns.
		buf := make([]byte, len(doneMsg))
		b.Read(buf)
	}()
	h, err := cli.Hello(16384, goroce.MTU1024)
	if err != nil {
		t.Fatal(err)
	}
	if h.RemoteVersion != Version || h.PageSize != 16384 || h.CacheLine != cacheLine || h.MTU != goroce.MTU1024 {
		t.Errorf("client hello: %+v", h)
	}
	d, err := cli.Handshake(cd)
	if err != nil || d != sd {
		t.Fatalf("client handshake: %+v, %v; want %+v", d, err, sd)
	}
	if _, err := cli.ExchangeReports(crep, h.RemoteVersion); err != nil {
		t.Fatal(err)
	}
	s := <-done
	if s.err != nil {
		t.Fatal(s.err)
	}
	if s.h.PageSize != 16384 || s.h.MTU != goroce.MTU1024 {
		t.Errorf("server hello: %+v; want the larger page size and the smaller MTU", s.h)
	}
	if s.d != cd || s.r != crep {
		t.Errorf("server got %+v and %+v; want %+v and %+v", s.d, s.r, cd, crep)
	}
	if err := cli.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// TestKeyPrefix: every prefix of a key message passes, and every other message of the exchange fails
// from its first bytes, so that a step that reads one fails at once instead of waiting for the rest.
func TestKeyPrefix(t *testing.T) {
	b := make([]byte, KeyLen)
	copy(b, goldenKey)
	for i := range b {
		if !keyPrefix(b[:i+1]) {
			t.Fatalf("keyPrefix refuses the golden key's first %d bytes %q", i+1, b[:i+1])
		}
	}
	for _, m := range []string{
		"6.06\x00\x00\x00\x00",             // a version
		"\x00\x00\x10\x00",                 // system data: the page size
		"5\x00",                            // the MTU
		"done\x00",                         // the end
		"\x00\x00\x00\x00\x00\x00\x10\x00", // a report's size
		"0000:0001:0012\x00x",              // NUL padding that goes on with text
	} {
		if keyPrefix([]byte(m)) {
			t.Errorf("keyPrefix accepts %q", m)
		}
	}
	if !looksLikeText([]byte("0000:000")) || looksLikeText([]byte("\x00\x00\x00\x00\x00\x00\x10\x00")) {
		t.Error("looksLikeText")
	}
}

// TestConnMismatch: a step that gets another step's message fails with a *MismatchError at once.
func TestConnMismatch(t *testing.T) {
	for _, c := range []struct {
		name string
		peer func(c *Conn) error // what the peer (the client) does
		step func(c *Conn) error // what this side (the server) does
	}{
		{"report where a key belongs", func(c *Conn) error {
			_, err := c.ExchangeReports(BWReport{Size: 65536, Iters: 20}, Version)
			return err
		}, func(c *Conn) error { _, err := c.Handshake(Dest{QPN: 1}); return err }},
		{"key where a report belongs", func(c *Conn) error {
			_, err := c.Handshake(Dest{QPN: 1})
			return err
		}, func(c *Conn) error { _, err := c.ExchangeReports(BWReport{}, Version); return err }},
		{"done where a key belongs", func(c *Conn) error { return c.Close() },
			func(c *Conn) error { _, err := c.Handshake(Dest{QPN: 1}); return err }},
		{"key where the version belongs (--dont_xchg_versions)", func(c *Conn) error {
			_, err := c.Handshake(Dest{QPN: 1})
			return err
		}, func(c *Conn) error { _, err := c.Hello(4096, goroce.MTU1024); return err }},
		{"version where a key belongs", func(c *Conn) error {
			_, err := c.Hello(4096, goroce.MTU1024)
			return err
		}, func(c *Conn) error { _, err := c.Handshake(Dest{QPN: 1}); return err }},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			defer b.Close()
			go c.peer(NewConn(a, true))
			err := c.step(NewConn(b, false))
			var m *MismatchError
			if !errors.As(err, &m) || !errors.Is(err, ErrMismatch) {
				t.Fatalf("got %v, want a *MismatchError", err)
			}
			t.Log(err)
		})
	}
}

// TestReportUnit: a report says its unit through its own figures.
func TestReportUnit(t *testing.T) {
	o := DefaultOptions(WriteBW)
	mbs := o.bwReport(65536, 1000, time.Second, 0)
	o.ReportGbits = true
	gbs := o.bwReport(65536, 1000, time.Second, 0)
	if u := reportUnit(mbs); u != mb {
		t.Errorf("MB/s report %+v: unit %v", mbs, u)
	}
	if u := reportUnit(gbs); u != gbit {
		t.Errorf("Gbit/s report %+v: unit %v", gbs, u)
	}
	if u := reportUnit(BWReport{}); u != 0 {
		t.Errorf("empty report: unit %v", u)
	}
}
