package main

import (
	"bytes"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/goroce/goroce/sim"
)

// goroce demo -w on loopback with loss, then goroce dump of the file: every packet the demo sent is
// there, every ICRC verifies, and each packet the impaired host dropped is marked lost on its line.
// Where tshark is installed, it decodes every packet as InfiniBand with no malformed packet and no
// expert warning.
func TestDemoCapture(t *testing.T) {
	path := filepath.Join(t.TempDir(), "demo.pcapng")
	var out bytes.Buffer
	o := demoOptions{a: netip.MustParseAddr("127.0.14.1"), b: netip.MustParseAddr("127.0.14.2"), mtu: 1024, loss: 20, seed: 5,
		write: path}
	if err := demo(&out, o); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	lost := strings.Count(out.String(), " LOST: ")
	if !strings.Contains(out.String(), "wrote ") {
		t.Fatalf("demo does not say it wrote the capture:\n%s", lastLines(out.String(), 3))
	}

	var dumped bytes.Buffer
	total, ok := dump(&dumped, dumpOptions{}, path)
	if !ok || total.roce == 0 || total.icrcOK != total.roce || total.packets != total.roce {
		t.Fatalf("dump: %s\n%s", total.line(), lastLines(dumped.String(), 5))
	}
	if n := strings.Count(dumped.String(), "lost: injected loss]\n"); n != lost {
		t.Errorf("dump marks %d packets lost, the demo lost %d", n, lost)
	}
	t.Logf("demo -loss 20: %s; %d lost", total.line(), lost)
	// Every retransmission says what set it off, from the sending device's own trace.
	if r, c := strings.Count(dumped.String(), " retransmit icrc ok"), strings.Count(dumped.String(), " retransmit icrc ok [resent: "); r == 0 || r != c {
		t.Errorf("%d retransmissions, %d with their cause", r, c)
	}

	tshark, err := exec.LookPath("tshark")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("tshark is not installed, and CI is set: .ci/run installs it (apt-get install tshark)")
		}
		t.Log("tshark is not installed: not checked with it")
		return
	}
	all, err := exec.Command(tshark, "-r", path, "-n").Output()
	if err != nil {
		t.Fatal(err)
	}
	bad, err := exec.Command(tshark, "-r", path, "-n", "-o", "ip.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE",
		"-Y", "!infiniband || _ws.malformed || _ws.expert.severity >= 0x00600000").Output()
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(all), "\n"); n != total.packets || len(bad) > 0 {
		t.Errorf("tshark reads %d packets of %d; not InfiniBand, malformed or warned about:\n%s", n, total.packets, bad)
	}
}

// goroce sim run ladder -w, then goroce dump of the file: one record per packet sent, every ICRC
// verifies, and each packet the lossy cable lost is marked on its line.
func TestSimRunCapture(t *testing.T) {
	p, err := sim.DefaultParams("ladder")
	if err != nil {
		t.Fatal(err)
	}
	var sends, losses int
	p.Tracer = func(e *sim.TraceEvent) {
		switch {
		case e.Kind == sim.TraceSend:
			sends++
		case e.Kind == sim.TraceDrop && e.Reason == sim.DropLoss:
			losses++
		}
	}
	path := filepath.Join(t.TempDir(), "ladder.pcapng")
	var out bytes.Buffer
	if _, err := runOneScenario(&out, "ladder", p, runFiles{pcap: path}); err != nil {
		t.Fatal(err)
	}
	var dumped bytes.Buffer
	total, ok := dump(&dumped, dumpOptions{}, path)
	if !ok || total.roce != sends || total.icrcOK != sends {
		t.Fatalf("dump: %s; %d packets sent\n%s", total.line(), sends, lastLines(dumped.String(), 5))
	}
	if n := strings.Count(dumped.String(), " icrc ok [lost: link loss (a>b)]\n") + strings.Count(dumped.String(), " icrc ok [lost: link loss (b>a)]\n"); n != losses || losses == 0 {
		t.Errorf("dump marks %d packets lost, the cable lost %d", n, losses)
	}
}
