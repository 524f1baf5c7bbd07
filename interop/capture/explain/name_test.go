package explain

import (
	"bytes"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/interop/capture"
	"github.com/goroce/goroce/wire"
)

// wiresharkNames are the names Wireshark 4.0's InfiniBand dissector shows in its Info column for every
// opcode goroce knows, as tshark printed them for TestOpcodeNamesTshark's capture; FLUSH, ATOMIC_WRITE and
// the CNP, which it calls "Unknown OpCode", are spelled the same way.
var wiresharkNames = map[wire.Opcode]string{
	0x00: "RC Send First", 0x01: "RC Send Middle", 0x02: "RC Send Last", 0x03: "RC Send Last Immediate",
	0x04: "RC Send Only", 0x05: "RC Send Only Immediate", 0x06: "RC RDMA Write First", 0x07: "RC RDMA Write Middle",
	0x08: "RC RDMA Write Last", 0x09: "RC RDMA Write Last Immediate", 0x0A: "RC RDMA Write Only",
	0x0B: "RC RDMA Write Only Immediate", 0x0C: "RC RDMA Read Request", 0x0D: "RC RDMA Read Response First",
	0x0E: "RC RDMA Read Response Middle", 0x0F: "RC RDMA Read Response Last", 0x10: "RC RDMA Read Response Only",
	0x11: "RC Acknowledge", 0x12: "RC Atomic Acknowledge", 0x13: "RC Compare Swap", 0x14: "RC Fetch Add",
	0x16: "RC Send Last Invalidate", 0x17: "RC Send Only Invalidate", 0x1C: "RC Flush", 0x1D: "RC Atomic Write",
	0x20: "UC Send First", 0x21: "UC Send Middle", 0x22: "UC Send Last", 0x23: "UC Send Last Immediate",
	0x24: "UC Send Only", 0x25: "UC Send Only Immediate", 0x26: "UC RDMA Write First", 0x27: "UC RDMA Write Middle",
	0x28: "UC RDMA Write Last", 0x29: "UC RDMA Write Last Immediate", 0x2A: "UC RDMA Write Only",
	0x2B: "UC RDMA Write Only Immediate", 0x64: "UD Send Only", 0x65: "UD Send Only Immediate", 0x81: "CNP",
}

// TestOpcodeNames walks all 256 opcodes: every one wire knows has Wireshark's name, the others their
// number.
func TestOpcodeNames(t *testing.T) {
	for i := range 256 {
		op := wire.Opcode(i)
		want, ok := wiresharkNames[op]
		if !ok {
			want = op.String()
		}
		if ok != op.Valid() {
			t.Errorf("%#02x: valid %v, in the table %v", i, op.Valid(), ok)
		}
		if got := OpcodeName(op); got != want {
			t.Errorf("%#02x: %q, want %q", i, got, want)
		}
	}
}

// TestOpcodeNamesTshark has the installed tshark (Debian's package; skipped where it is absent) name one
// packet of every opcode goroce knows, and compares its Info column with OpcodeName. Wireshark names no
// FLUSH, ATOMIC_WRITE or CNP ("Unknown OpCode"); those are skipped.
func TestOpcodeNamesTshark(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("tshark is not installed, and CI is set: .ci/run installs it (apt-get install tshark)")
		}
		t.Skip("tshark is not installed (Debian: apt-get install tshark); CI runs this test")
	}
	var buf bytes.Buffer
	w, err := capture.NewWriter(&buf, &capture.Options{Hold: -1})
	if err != nil {
		t.Fatal(err)
	}
	var ops []wire.Opcode
	for i := range 256 {
		op := wire.Opcode(i)
		if !op.Valid() {
			continue
		}
		f := wire.Fields{BTH: wire.BTHFields{Opcode: op, PKey: wire.DefaultPKey, DestQP: 0x11, PSN: 5}}
		f.DETH = wire.DETHFields{QKey: 0x11111111, SrcQP: 0x22} // not QP1: Wireshark would decode a MAD
		f.RETH.DMALen = 64
		var payload []byte
		if op.Info().Payload {
			payload = make([]byte, 64)
			if op == wire.RCAtomicWrite {
				payload = payload[:8]
			}
		}
		b, err := wire.Append(nil, &f, payload)
		if err != nil {
			t.Fatal(op, err)
		}
		err = w.WritePacket(&capture.Packet{At: time.Unix(1, 0), From: netip.MustParseAddrPort("10.0.0.1:49152"),
			To: netip.MustParseAddrPort("10.0.0.2:4791"), Payload: b})
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, op)
	}
	w.Close()
	cmd := exec.Command(tshark, "-r", "-", "-T", "fields", "-e", "_ws.col.Info")
	cmd.Stdin = &buf
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != len(ops) {
		t.Fatalf("tshark printed %d lines for %d packets:\n%s", len(lines), len(ops), out)
	}
	named := 0
	for i, l := range lines {
		if strings.HasPrefix(l, "Unknown OpCode") {
			if ops[i] != wire.RCFlush && ops[i] != wire.RCAtomicWrite && ops[i] != wire.CNP {
				t.Errorf("%#02x: tshark knows no name", uint8(ops[i]))
			}
			continue
		}
		named++
		// The Info column is the name, a space, and "QP=..." (Wireshark 4.0 leaves out the space after
		// "UC RDMA Write First").
		name, _, _ := strings.Cut(l, "QP=")
		if name = strings.TrimSpace(name); name != OpcodeName(ops[i]) {
			t.Errorf("%#02x: tshark %q, OpcodeName %q", uint8(ops[i]), name, OpcodeName(ops[i]))
		}
	}
	t.Logf("%d opcodes, %d named by tshark the same way", len(ops), named)
}
