//go:build interop

package interop

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/syncbuf"
	"github.com/goroce/goroce/interop/lab"
)

// The GSO tests check, with gsoprobe (interop/gsoprobe), the facts goroce's UDP GSO sends rely on: from
// an unconnected socket with IP_PMTUDISC_DO, segment i of one GSO send carries IPv4 identification i
// and DF, a plain datagram identification 0 and DF; on the way to rxe each segment stays a datagram of
// its own with those headers; and rxe therefore accepts an ICRC computed for identification i.

// gsoprobeGuestPath is where the tests put gsoprobe in the guest.
const gsoprobeGuestPath = "/tmp/gsoprobe"

// gsoRun is the shape of every probe send: calls GSO writes of n segments, then one plain datagram.
type gsoRun struct{ seg, n, calls int }

func (r gsoRun) datagrams() int { return r.calls*r.n + 1 }

func (r gsoRun) sendArgs(from, to string) []string {
	return []string{"send", "-from", from, "-to", to, "-seg", strconv.Itoa(r.seg), "-n", strconv.Itoa(r.n), "-calls", strconv.Itoa(r.calls)}
}

// buildGSOProbe builds gsoprobe statically (the guest has no Go and another libc) into a temporary
// directory and returns its path.
func buildGSOProbe(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "gsoprobe")
	cmd := exec.Command("go", "build", "-o", bin, "./gsoprobe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building gsoprobe: %v\n%s", err, out)
	}
	return bin
}

// installGSOProbe builds gsoprobe, copies it into guest g and returns the host copy's path.
func installGSOProbe(t testing.TB, g *lab.Guest) string {
	t.Helper()
	bin := buildGSOProbe(t)
	f, err := os.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out syncbuf.Buffer
	if err := g.ExecIO(ctx, "cat > "+gsoprobeGuestPath+" && chmod +x "+gsoprobeGuestPath, f, &out); err != nil {
		t.Fatalf("copying gsoprobe into vm%d: %v\n%s", g.N, err, out.String())
	}
	return bin
}

// gsoPkt is one line of gsoprobe capture.
type gsoPkt struct {
	line           string
	dev            string
	id, df, length int
	call           string // a number, "plain" or "none"
	seg, markers   int
	icrc           string // "ok", "bad" or "" (not RoCEv2)
}

// parseGSOCapture returns the datagrams gsoprobe capture reported in out.
func parseGSOCapture(t testing.TB, out string) []gsoPkt {
	t.Helper()
	var pkts []gsoPkt
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "pkt ") {
			continue
		}
		f := map[string]string{}
		for _, kv := range strings.Fields(line)[1:] {
			k, v, _ := strings.Cut(kv, "=")
			f[k] = v
		}
		num := func(k string) int {
			n, err := strconv.Atoi(f[k])
			if err != nil && f["call"] != "none" {
				t.Errorf("capture line %q: field %s: %v", line, k, err)
			}
			return n
		}
		pkts = append(pkts, gsoPkt{line: line, dev: f["dev"], id: num("id"), df: num("df"), length: num("len"),
			call: f["call"], seg: num("seg"), markers: num("markers"), icrc: f["icrc"]})
	}
	return pkts
}

// checkGSOIDs checks that pkts are the datagrams of run, each once and on its own: segment i of every
// call with identification i, the plain datagram with 0, all with DF and the length of one segment.
// It returns the number of problems found.
func checkGSOIDs(t testing.TB, pkts []gsoPkt, run gsoRun) int {
	t.Helper()
	bad := 0
	errorf := func(format string, args ...any) {
		t.Helper()
		bad++
		t.Errorf(format, args...)
	}
	if len(pkts) != run.datagrams() {
		errorf("captured %d datagrams, want %d (%d calls of %d segments and a plain one)", len(pkts), run.datagrams(), run.calls, run.n)
	}
	seen := map[string]int{}
	for _, p := range pkts {
		seen[p.call+"/"+strconv.Itoa(p.seg)]++
		if p.markers != 1 {
			errorf("datagram holds %d segments' markers (coalesced?): %s", p.markers, p.line)
		}
		if p.length != 20+8+run.seg {
			errorf("IPv4 total length %d, want %d (one segment): %s", p.length, 20+8+run.seg, p.line)
		}
		if p.df != 1 {
			errorf("DF not set: %s", p.line)
		}
		want := p.seg
		if p.call == "plain" {
			want = 0
		}
		if p.id != want {
			errorf("identification %d, want %d: %s", p.id, want, p.line)
		}
	}
	for c := 0; c < run.calls; c++ {
		for s := 0; s < run.n; s++ {
			if k := fmt.Sprintf("%d/%d", c, s); seen[k] != 1 {
				errorf("call %d segment %d captured %d times, want once", c, s, seen[k])
			}
		}
	}
	if seen["plain/0"] != 1 {
		errorf("plain datagram captured %d times, want once", seen["plain/0"])
	}
	return bad
}

// logPkts logs the capture lines.
func logPkts(t testing.TB, who string, pkts []gsoPkt) {
	t.Helper()
	var b strings.Builder
	for _, p := range pkts {
		b.WriteString(p.line + "\n")
	}
	t.Logf("%s (%d datagrams):\n%s", who, len(pkts), b.String())
}

// TestGSOIdentificationGuest checks the identification facts on the guest's own kernel (Debian
// bookworm's 6.1): gsoprobe sends GSO to 127.0.0.1 in the guest and captures on lo with
// tx-udp-segmentation off, so that the kernel segments in software before the capture point (with it on,
// lo passes the super-packet whole and the capture would see one datagram per call).
func TestGSOIdentificationGuest(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	installGSOProbe(t, g)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	run := gsoRun{seg: 1200, n: 8, calls: 3}
	const port = 19501
	p := gsoprobeGuestPath
	// The capture ends by its count or its timeout, and restores lo's feature either way.
	script := fmt.Sprintf(`uname -r
rm -f %[1]s.ready
%[1]s capture -iface lo -gso-off lo -port %[2]d -count %[3]d -timeout 60s -ready %[1]s.ready &
cap=$!
for i in $(seq 300); do [ -e %[1]s.ready ] && break; sleep 0.1; done
%[1]s send %[4]s
wait $cap`, p, port, run.datagrams(), strings.Join(run.sendArgs("127.0.0.1:0", fmt.Sprintf("127.0.0.1:%d", port))[1:], " "))
	out, err := g.Exec(ctx, script)
	t.Logf("vm%d:\n%s", g.N, out)
	if err != nil {
		t.Fatalf("gsoprobe in vm%d: %v", g.N, err)
	}
	if !strings.Contains(out, "tx-udp-segmentation: on -> off") && !strings.Contains(out, "tx-udp-segmentation: off -> off") {
		t.Errorf("tx-udp-segmentation was not turned off on lo")
	}
	pkts := parseGSOCapture(t, out)
	checkGSOIDs(t, pkts, run)
}

// virtioNetFeatures names the virtio-net feature bits (virtio spec 5.1.3 and 6) that bear on offloads.
var virtioNetFeatures = map[int]string{
	0: "CSUM", 1: "GUEST_CSUM", 2: "CTRL_GUEST_OFFLOADS", 3: "MTU", 5: "MAC",
	7: "GUEST_TSO4", 8: "GUEST_TSO6", 9: "GUEST_ECN", 10: "GUEST_UFO",
	11: "HOST_TSO4", 12: "HOST_TSO6", 13: "HOST_ECN", 14: "HOST_UFO", 15: "MRG_RXBUF",
	16: "STATUS", 17: "CTRL_VQ", 18: "CTRL_RX", 19: "CTRL_VLAN", 21: "GUEST_ANNOUNCE", 22: "MQ",
	23: "CTRL_MAC_ADDR", 28: "RING_INDIRECT_DESC", 29: "RING_EVENT_IDX", 32: "VERSION_1",
	33: "ACCESS_PLATFORM", 34: "RING_PACKED", 35: "IN_ORDER", 36: "ORDER_PLATFORM", 37: "SR_IOV",
	38: "NOTIFICATION_DATA", 39: "NOTIF_CONFIG_DATA", 40: "RING_RESET",
	54: "GUEST_USO4", 55: "GUEST_USO6", 56: "HOST_USO", 57: "HASH_REPORT", 60: "RSS",
}

// decodeVirtioFeatures turns /sys/class/net/*/device/features (one '0' or '1' a bit, bit 0 first)
// into feature names.
func decodeVirtioFeatures(bits string) []string {
	var names []string
	for i, c := range strings.TrimSpace(bits) {
		if c != '1' {
			continue
		}
		if n, ok := virtioNetFeatures[i]; ok {
			names = append(names, n)
		} else {
			names = append(names, fmt.Sprintf("bit%d", i))
		}
	}
	return names
}

// offloadLines keeps the feature lines that bear on UDP segmentation and checksums.
func offloadLines(features string) string {
	re := regexp.MustCompile(`^(tx-checksum-ip-generic|tx-checksum-ipv4|rx-checksum|scatter-gather|tx-scatter-gather|tx-generic-segmentation|tx-tcp-segmentation|tx-udp-segmentation|tx-udp-fragmentation|tx-gso-partial|tx-gso-list|rx-gro|rx-gro-list|rx-udp-gro-forwarding|rx-gro-hw|rx-lro):`)
	var keep []string
	for _, l := range strings.Split(features, "\n") {
		if re.MatchString(l) {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// featureOn reports whether gsoprobe features output lists name as on.
func featureOn(features, name string) bool {
	return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `: on`).MatchString(features)
}

// gsoPath describes the offloads between goroce's side of the bridge and guest g, logs them and
// returns the host tap's features.
func gsoPath(ctx context.Context, t testing.TB, g *lab.Guest, bin string) (tap string) {
	t.Helper()
	tapName := fmt.Sprintf("grxtap%d", g.N)
	for _, dev := range []string{lab.Bridge, tapName} {
		out, err := lab.NSCommand(ctx, bin, "features", "-iface", dev).CombinedOutput()
		if err != nil {
			t.Fatalf("features of %s: %v\n%s", dev, err, out)
		}
		t.Logf("host %s (namespace %s) offloads:\n%s", dev, lab.Namespace, offloadLines(string(out)))
		if dev == tapName {
			tap = string(out)
		}
	}
	out, err := g.Exec(ctx, gsoprobeGuestPath+" features -iface eth0")
	if err != nil {
		t.Fatalf("features of the guest's eth0: %v\n%s", err, out)
	}
	t.Logf("vm%d eth0 (virtio-net) offloads:\n%s", g.N, offloadLines(out))
	bits, err := g.Exec(ctx, "cat /sys/class/net/eth0/device/features; readlink /sys/class/net/eth0/device/driver")
	if err != nil {
		t.Fatalf("virtio features: %v\n%s", err, bits)
	}
	first, rest, _ := strings.Cut(bits, "\n")
	t.Logf("vm%d eth0 negotiated virtio features (%s): %s", g.N, strings.TrimSpace(rest), strings.Join(decodeVirtioFeatures(first), " "))
	return tap
}

// captureInGuest starts gsoprobe capture in guest g with args and returns once it is bound; the
// channel yields its output when it ends (by its count or its timeout).
func captureInGuest(ctx context.Context, t testing.TB, g *lab.Guest, args string) <-chan execResult {
	t.Helper()
	ready := gsoprobeGuestPath + ".ready"
	if out, err := g.Exec(ctx, "rm -f "+ready); err != nil {
		t.Fatalf("vm%d: %v\n%s", g.N, err, out)
	}
	res := execBackground(ctx, g, fmt.Sprintf("%s capture %s -ready %s", gsoprobeGuestPath, args, ready))
	for {
		if _, err := g.Exec(ctx, "test -e "+ready); err == nil {
			return res
		}
		select {
		case r := <-res:
			t.Fatalf("gsoprobe capture in vm%d ended before it was ready: %v\n%s", g.N, r.err, r.out)
		case <-ctx.Done():
			t.Fatalf("gsoprobe capture in vm%d not ready: %v", g.N, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// captureInNS starts gsoprobe capture in the namespace with args and returns once it is bound, with a
// function that waits for it to end and returns its output.
func captureInNS(ctx context.Context, t testing.TB, bin string, args ...string) func() (string, error) {
	t.Helper()
	ready := filepath.Join(t.TempDir(), "ready")
	cmd := lab.NSCommand(ctx, bin, append(append([]string{"capture"}, args...), "-ready", ready)...)
	out, waited := startReady(t, cmd, "gsoprobe capture in the namespace ended before it was ready", func(string) bool {
		_, err := os.Stat(ready)
		return err == nil
	})
	return func() (string, error) {
		err := <-waited
		return out.String(), err
	}
}

// TestGSOIdentificationToGuest sends GSO the way goroce does, from the host side of the bridge
// (10.77.0.1 in the namespace) to guest 1, and captures on the host's tap (what qemu reads) and on the
// guest's eth0 (what rxe would get). The tap negotiated no UDP segmentation offload (qemu 7.2 knows no
// TUN_F_USO4), so neither has the bridge, whose offloads are its ports' (br_features_recompute): the
// host kernel segments in software as the super-packet leaves through the bridge (validate_xmit_skb,
// __udp_gso_segment, inet_gso_segment). Each segment then crosses bridge, tap, qemu and virtio-net as a
// frame of its own, and the guest, which does no UDP GRO for a port without a GRO-enabled socket
// (udp_gro_receive), gets each as a datagram with identification i and DF.
func TestGSOIdentificationToGuest(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	bin := installGSOProbe(t, g)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tap := gsoPath(ctx, t, g, bin)
	tapUSO := featureOn(tap, "tx-udp-segmentation")
	if tapUSO {
		t.Logf("the tap takes UDP GSO super-packets (tx-udp-segmentation on): qemu hands them to the guest whole")
	} else {
		t.Logf("the tap, hence the bridge, has tx-udp-segmentation off: the host kernel segments in software before the bridge")
	}

	run := gsoRun{seg: 1200, n: 8, calls: 3}
	const port = 19502
	tapName := fmt.Sprintf("grxtap%d", g.N)
	countArgs := []string{"-port", strconv.Itoa(port), "-count", strconv.Itoa(run.datagrams()), "-timeout", "60s"}
	guestCap := captureInGuest(ctx, t, g, "-iface eth0 "+strings.Join(countArgs, " "))
	// On the tap the datagrams leave the host towards qemu: outgoing.
	hostCap := captureInNS(ctx, t, bin, append([]string{"-iface", tapName, "-outgoing"}, countArgs...)...)

	sout, serr := lab.NSCommand(ctx, bin, run.sendArgs(lab.HostIP+":0", fmt.Sprintf("%v:%d", g.IP, port))...).CombinedOutput()
	t.Logf("gsoprobe send (namespace):\n%s", sout)
	if serr != nil {
		t.Fatalf("gsoprobe send: %v", serr)
	}
	hout, herr := hostCap()
	gres := <-guestCap
	hpkts, gpkts := parseGSOCapture(t, hout), parseGSOCapture(t, gres.out)
	logPkts(t, "host "+tapName+", towards qemu", hpkts)
	logPkts(t, fmt.Sprintf("vm%d eth0, received", g.N), gpkts)
	if herr != nil {
		t.Errorf("capture on %s: %v\n%s", tapName, herr, hout)
	}
	if gres.err != nil {
		t.Errorf("capture in vm%d: %v\n%s", g.N, gres.err, gres.out)
	}
	if tapUSO {
		// Not the lab as built (qemu 7.2): the guest would see super-packets and segment them itself.
		t.Errorf("the tap negotiated UDP segmentation offload; the checks below assume the host segments")
	}
	if checkGSOIDs(t, hpkts, run) == 0 {
		t.Logf("host side: each segment left for the tap as its own datagram, identification = segment index, DF")
	}
	if checkGSOIDs(t, gpkts, run) == 0 {
		t.Logf("guest side: each segment arrived as its own datagram, identification = segment index, DF")
	}
}

// rxeRcvdPkts reads rxe's count of received packets that passed its header checks and ICRC
// (drivers/infiniband/sw/rxe/rxe_recv.c, rxe_rcv: RXE_CNT_RCVD_PKTS after rxe_icrc_check).
func rxeRcvdPkts(ctx context.Context, t testing.TB, g *lab.Guest) int {
	t.Helper()
	return rxeCounter(ctx, t, g, "rcvd_pkts")
}

// TestGSOICRCToGuestRXE checks that rxe accepts GSO segments whose ICRC was computed for
// identification = segment index. gsoprobe send -rocev2 sends, from the namespace, RoCEv2 UD SENDs to
// QP 1 (the GSI QP, which every rxe device has and which needs no connection set-up) carrying a MAD
// response nobody asked for (the MAD layer drops it), in GSO runs. rxe counts a packet in rcvd_pkts only
// after its header checks and its ICRC check pass; the guest's capture also checks each ICRC against
// the headers as received. With -icrc-id zero (the ICRC computed as if every segment carried 0) only
// segment 0 of each call and the plain datagram must pass: that shows rxe does check the identification.
func TestGSOICRCToGuestRXE(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	bin := installGSOProbe(t, g)
	run := gsoRun{seg: 280, n: 8, calls: 3} // BTH 12, DETH 8, MAD 256, ICRC 4
	for _, mode := range []string{"seq", "zero"} {
		t.Run("icrc-id="+mode, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			before := rxeRcvdPkts(ctx, t, g)
			guestCap := captureInGuest(ctx, t, g, fmt.Sprintf("-iface eth0 -port 4791 -count %d -timeout 60s", run.datagrams()))
			args := append(run.sendArgs(lab.HostIP+":0", g.IP.String()+":4791"), "-rocev2", "-icrc-id", mode)
			sout, serr := lab.NSCommand(ctx, bin, args...).CombinedOutput()
			t.Logf("gsoprobe send (namespace):\n%s", sout)
			if serr != nil {
				t.Fatalf("gsoprobe send: %v", serr)
			}
			gres := <-guestCap
			wantOK := run.datagrams()
			if mode == "zero" {
				wantOK = run.calls + 1
			}
			// The capture sees a datagram before the IP stack hands it to rxe: let rxe catch up, then
			// look once more for late counts.
			after := rxeRcvdPkts(ctx, t, g)
			for i := 0; i < 50 && after-before < wantOK; i++ {
				time.Sleep(100 * time.Millisecond)
				after = rxeRcvdPkts(ctx, t, g)
			}
			time.Sleep(300 * time.Millisecond)
			after = rxeRcvdPkts(ctx, t, g)
			pkts := parseGSOCapture(t, gres.out)
			logPkts(t, fmt.Sprintf("vm%d eth0, received", g.N), pkts)
			if gres.err != nil {
				t.Errorf("capture in vm%d: %v\n%s", g.N, gres.err, gres.out)
			}
			checkGSOIDs(t, pkts, run)
			ok := 0
			for _, p := range pkts {
				want := "ok"
				if mode == "zero" && p.call != "plain" && p.seg != 0 {
					want = "bad"
				}
				if p.icrc != want {
					t.Errorf("ICRC %q, want %q: %s", p.icrc, want, p.line)
				}
				if p.icrc == "ok" {
					ok++
				}
			}
			t.Logf("rxe rcvd_pkts %d -> %d: rxe accepted %d of %d datagrams; %d had an ICRC matching their headers as received",
				before, after, after-before, len(pkts), ok)
			if after-before != wantOK {
				t.Errorf("rxe accepted %d datagrams, want %d", after-before, wantOK)
			}
		})
	}
}

// rxeHWCounters reads rxe's port counters in guest g.
func rxeHWCounters(ctx context.Context, t testing.TB, g *lab.Guest) map[string]int {
	t.Helper()
	out, err := g.Exec(ctx, `cd /sys/class/infiniband/rxe0/ports/1/hw_counters && for c in *; do echo "$c $(cat $c)"; done`)
	if err != nil {
		t.Fatalf("reading rxe's counters: %v\n%s", err, out)
	}
	m := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			m[f[0]], _ = strconv.Atoi(f[1])
		}
	}
	return m
}

// goroceStats parses the line `goroce perf -stats` prints.
func goroceStats(t testing.TB, out string) map[string]int {
	t.Helper()
	m := map[string]int{}
	i := strings.Index(out, "goroce stats:")
	if i < 0 {
		t.Fatalf("goroce perf printed no stats line:\n%s", out)
	}
	line, _, _ := strings.Cut(out[i+len("goroce stats:"):], "\n")
	for _, kv := range strings.Fields(line) {
		k, v, _ := strings.Cut(kv, "=")
		m[k], _ = strconv.Atoi(v)
	}
	return m
}

// TestGSOPerftestRXE: perftest's bandwidth tests at path MTU 4096 with goroce's GSO on, goroce in both
// roles. Where goroce sends the data (WRITE as client, READ responses as server) its runs leave as GSO
// writes, and rxe, which checks the whole ICRC and drops a packet that fails silently (counted
// nowhere, 6.1's rxe_icrc_check), counts in rcvd_pkts exactly the packets goroce sent, with no
// sequence errors: every segment's ICRC, sealed for the identification the host kernel gave it,
// verified. Where rxe sends, goroce drops nothing.
func TestGSOPerftestRXE(t *testing.T) {
	_, gs := lab.Start(t, 1)
	g := gs[0]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cases := []struct {
		c           perftestCase
		goroceSends bool
		client      bool
	}{
		{perftestCase{test: "write_bw", flags: "-m 4096", size: 65536, iters: 200, goroceFlags: "-stats"}, true, true},
		{perftestCase{test: "read_bw", flags: "-m 4096", size: 65536, iters: 100, goroceFlags: "-stats"}, true, false},
		{perftestCase{test: "write_bw", flags: "-m 4096", size: 65536, iters: 200, goroceFlags: "-stats"}, false, false},
		{perftestCase{test: "read_bw", flags: "-m 4096", size: 65536, iters: 100, goroceFlags: "-stats"}, false, true},
	}
	for i, tc := range cases {
		role := "server"
		if tc.client {
			role = "client"
		}
		t.Run(tc.c.test+"-goroce-"+role, onGuest(g, nil, func(t testing.TB) {
			before := rxeHWCounters(ctx, t, g)
			r := runPerftest(t, func(attempt int) perftestRun {
				if tc.client {
					return perftestGoroceClient(g, tc.c, 19215+i+200*attempt)
				}
				return perftestGoroceServer(g, tc.c, 19215+i+200*attempt)
			})
			after := rxeHWCounters(ctx, t, g)
			t.Logf("goroce perf %s (%s):\n%s", tc.c.test, role, r.goroceOut)
			r.check(t, tc.c)
			st := goroceStats(t, r.goroceOut)
			delta := func(k string) int { return after[k] - before[k] }
			t.Logf("goroce: %v; rxe: rcvd_pkts +%d sent_pkts +%d out_of_seq_request +%d duplicate_request +%d",
				st, delta("rcvd_pkts"), delta("sent_pkts"), delta("out_of_seq_request"), delta("duplicate_request"))
			if tc.goroceSends {
				if st["tx_gso"] == 0 {
					t.Errorf("goroce sent no GSO run (tx_gso=0): the test shows nothing")
				}
				if delta("rcvd_pkts") != st["tx_packets"] || delta("out_of_seq_request") != 0 || st["completer_retry_err"] != 0 {
					t.Errorf("rxe took %d of the %d packets goroce sent (out_of_seq_request +%d, goroce retries %d): some failed its ICRC check",
						delta("rcvd_pkts"), st["tx_packets"], delta("out_of_seq_request"), st["completer_retry_err"])
				}
			} else if st["drop_icrc"] != 0 || st["rx_packets"] != delta("sent_pkts") {
				t.Errorf("goroce took %d of the %d packets rxe sent, %d failing the ICRC check", st["rx_packets"], delta("sent_pkts"), st["drop_icrc"])
			}
		}))
	}
}
