package capture

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/goroce/goroce"
)

// Wireshark's expert severities (epan/proto.h, PI_WARN and PI_ERROR): anything at or above a warning
// fails the check.
const tsharkWarn = 0x00600000

// TestTshark has tshark (Debian's package; skipped where it is not installed) decode a device capture
// and a simulator capture: every packet is InfiniBand (RoCEv2 on UDP 4791), none is malformed, no
// expert info reaches a warning with IP and UDP checksum validation on, and each packet's comments are
// the ones this package's Reader reads.
//
// tshark 4.0's RPC-over-RDMA heuristic throws on an RC SEND whose payload is shorter than 13 bytes
// and calls the packet malformed (a SEND of 7 bytes does it); the captured runs send none.
func TestTshark(t *testing.T) {
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("tshark is not installed, and CI is set: .ci/run installs it (apt-get install tshark)")
		}
		t.Skip("tshark is not installed (Debian: apt-get install tshark); CI runs this test")
	}
	mem := captureMemRun(t, goroce.Impairment{Loss: 0.03, Duplicate: 0.02, CE: 0.05, Seed: 7})
	checkTshark(t, tshark, mem.path, mem.recs)
	s := captureSimRun(t, 3)
	checkTshark(t, tshark, s.path, s.recs)
}

func checkTshark(t *testing.T, tshark, file string, recs []Record) {
	t.Helper()
	args := []string{"-r", file, "-n", "-o", "ip.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE",
		"-T", "fields", "-E", "separator=/t", "-E", "occurrence=a", "-E", "aggregator=|",
		"-e", "frame.number", "-e", "frame.protocols", "-e", "_ws.expert.severity", "-e", "_ws.expert.message", "-e", "frame.comment"}
	out, err := exec.Command(tshark, args...).Output()
	if err != nil {
		t.Fatalf("tshark %s: %v", strings.Join(args, " "), err)
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(lines) != len(recs) {
		t.Fatalf("tshark read %d packets, the Reader %d", len(lines), len(recs))
	}
	ib, commented := 0, 0
	for i, l := range lines {
		f := strings.Split(l, "\t")
		if len(f) != 5 {
			t.Fatalf("tshark line %q", l)
		}
		if strings.HasSuffix(f[1], ":infiniband") || strings.Contains(f[1], ":infiniband:") {
			ib++
		} else {
			t.Errorf("packet %s: protocols %s", f[0], f[1])
		}
		if f[2] != "" {
			for _, s := range strings.Split(f[2], "|") {
				if v, err := strconv.ParseUint(s, 0, 32); err != nil || v >= tsharkWarn {
					t.Errorf("packet %s: expert info %s: %s", f[0], f[2], f[3])
				}
			}
		}
		if want := strings.Join(recs[i].Comments, "|"); f[4] != want {
			t.Errorf("packet %s: tshark reads comments %q, the Reader %q", f[0], f[4], want)
		}
		if f[4] != "" {
			commented++
		}
	}
	t.Logf("tshark %s: %d packets, %d InfiniBand, %d with comments, none malformed or warned about",
		strings.Join(args, " "), len(lines), ib, commented)
}
