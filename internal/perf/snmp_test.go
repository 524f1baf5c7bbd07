package perf

import (
	"bufio"
	"strings"
	"testing"
)

func TestParseUDPDrops(t *testing.T) {
	const snmp = `Ip: Forwarding DefaultTTL
Ip: 1 64
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
Udp: 48647185 1134 1107 48653325 1100 7 0 0 0
UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
UdpLite: 0 0 0 0 5 5 0 0 0
`
	d, ok := parseUDPDrops(bufio.NewScanner(strings.NewReader(snmp)))
	if !ok || d != (udpDrops{RcvbufErrors: 1100, SndbufErrors: 7}) {
		t.Errorf("parse: %+v, %v", d, ok)
	}
	if _, ok := parseUDPDrops(bufio.NewScanner(strings.NewReader("Ip: a\nIp: 1\n"))); ok {
		t.Error("parsed counters from a file without Udp lines")
	}
	var r Result
	noteUDPDrops(&r, udpDrops{10, 3}, udpDrops{12, 3})
	if len(r.Notes) != 1 || !strings.Contains(r.Notes[0], "2 UDP datagrams") {
		t.Errorf("notes %q", r.Notes)
	}
}
