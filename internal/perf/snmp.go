package perf

import (
	"bufio"
	"os"
	"strconv"
	"strings"
)

// udpDrops are the host's UDP drop counters (Linux /proc/net/snmp): datagrams the kernel dropped
// for want of receive or send buffer space. They are host-wide: any other program's UDP traffic
// counts too.
type udpDrops struct {
	RcvbufErrors, SndbufErrors uint64
}

// snmpPath is where Linux keeps them.
const snmpPath = "/proc/net/snmp"

// readUDPDrops returns the host's UDP drop counters, and false where they cannot be read.
func readUDPDrops() (udpDrops, bool) {
	f, err := os.Open(snmpPath)
	if err != nil {
		return udpDrops{}, false
	}
	defer f.Close()
	return parseUDPDrops(bufio.NewScanner(f))
}

// parseUDPDrops reads the two "Udp:" lines, names then values.
func parseUDPDrops(sc *bufio.Scanner) (udpDrops, bool) {
	var names []string
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || fields[0] != "Udp:" {
			continue
		}
		if names == nil {
			names = fields
			continue
		}
		var d udpDrops
		found := 0
		for i, name := range names {
			if i >= len(fields) {
				break
			}
			v, err := strconv.ParseUint(fields[i], 10, 64)
			switch {
			case err != nil:
			case name == "RcvbufErrors":
				d.RcvbufErrors, found = v, found+1
			case name == "SndbufErrors":
				d.SndbufErrors, found = v, found+1
			}
		}
		return d, found == 2
	}
	return udpDrops{}, false
}

// noteUDPDrops notes the host's UDP drops between before and after.
func noteUDPDrops(r *Result, before, after udpDrops) {
	if n := after.RcvbufErrors - before.RcvbufErrors; n > 0 {
		r.notef("host-wide: %d UDP datagrams dropped by the kernel for want of receive buffer space", n)
	}
	if n := after.SndbufErrors - before.SndbufErrors; n > 0 {
		r.notef("host-wide: %d UDP datagrams dropped by the kernel for want of send buffer space", n)
	}
}
