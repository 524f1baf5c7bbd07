package wire

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
)

// capturedFrame is one RoCEv2 packet from a capture file: the IP packet (IP header through ICRC) and
// where it came from.
type capturedFrame struct {
	file string
	n    int    // 1-based packet number in the file
	ip   []byte // IPv4 or IPv6 packet, Ethernet padding removed
}

// readCaptures returns every UDP/4791 packet of every classic-pcap Ethernet capture in dir. It is a
// test helper: the wire package itself reads no files.
func readCaptures(t testing.TB, dir string) []capturedFrame {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.pcap"))
	if err != nil {
		t.Fatal(err)
	}
	var out []capturedFrame
	for _, f := range files {
		out = append(out, readCapture(t, f)...)
	}
	if len(out) == 0 {
		t.Fatalf("no RoCEv2 packets in %s", dir)
	}
	return out
}

func readCapture(t testing.TB, file string) []capturedFrame {
	t.Helper()
	d, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(d) < 24 || binary.LittleEndian.Uint32(d) != 0xa1b2c3d4 {
		t.Fatalf("%s: not a little-endian microsecond pcap", file)
	}
	if lt := binary.LittleEndian.Uint32(d[20:]); lt != 1 {
		t.Fatalf("%s: link type %d, want Ethernet", file, lt)
	}
	var out []capturedFrame
	off, n := 24, 0
	for off+16 <= len(d) {
		incl := int(binary.LittleEndian.Uint32(d[off+8:]))
		orig := int(binary.LittleEndian.Uint32(d[off+12:]))
		off += 16
		frame := d[off : off+incl]
		off += incl
		n++
		if incl != orig || len(frame) < 14 {
			t.Fatalf("%s #%d: truncated capture", file, n)
		}
		ip := frame[14:]
		var udp []byte
		switch binary.BigEndian.Uint16(frame[12:]) {
		case 0x0800:
			if ip[9] != protoUDP {
				continue
			}
			ip = ip[:binary.BigEndian.Uint16(ip[2:])]
			udp = ip[int(ip[0]&0xF)*4:]
		case 0x86DD:
			if ip[6] != protoUDP {
				continue
			}
			ip = ip[:40+int(binary.BigEndian.Uint16(ip[4:]))]
			udp = ip[40:]
		default:
			continue
		}
		if binary.BigEndian.Uint16(udp[2:]) != UDPPort {
			continue
		}
		out = append(out, capturedFrame{file: filepath.Base(file), n: n, ip: ip})
	}
	return out
}

// goldenFrames returns every RoCEv2 packet of the captures in testdata/ and testdata/rxe/.
func goldenFrames(t testing.TB) []capturedFrame {
	t.Helper()
	fr := readCaptures(t, "testdata")
	if more, _ := filepath.Glob("testdata/rxe/*.pcap"); len(more) > 0 {
		fr = append(fr, readCaptures(t, "testdata/rxe")...)
	}
	return fr
}
