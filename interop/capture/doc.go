// Package capture writes goroce's own traffic to pcapng files that Wireshark, tshark and `goroce dump`
// read: the packets a device sends, receives and drops (through goroce.Config.Tracer), the packets an
// impairment loses (goroce.Impairment.Dropped), and the packets of a simulated network, stamped in
// virtual time (sim.Sim.SetTracer).
//
// A device sends on a UDP socket and never sees the headers the kernel puts around its packets; the
// Writer rebuilds them as they were on the wire, down to the fields the RoCEv2 ICRC covers (the IPv4
// identification the ICRC was sealed with, DF, addresses, ports, lengths), so that every ICRC in the
// file verifies. Packets the device dropped and packets lost on the way are in the file too, each with
// a pcapng comment saying why ("dropped: bad ICRC", "lost: injected loss"), and a request the device
// sent again says what set it off ("resent: NAK", "resent: timeout", "resent: tail-loss probe"), which
// Wireshark shows as the packet's comment (filter pkt_comment), `goroce dump` prints on the packet's
// line and `goroce dump -explain` takes for the retransmission's cause instead of inferring it.
//
// To capture a device in a test:
//
//	cw, err := capture.Create(filepath.Join(t.TempDir(), "run.pcapng"), nil)
//	...
//	defer cw.Close()
//	dev, err := goroce.Open(goroce.Config{Addr: addr, Port: goroce.DefaultPort, Network: net,
//		Tracer: cw.Tracer(nil)})
//
// Readers know RoCEv2 by its UDP destination port, 4791 (goroce.DefaultPort): a device on another
// port (Config.Port 0 picks one) is captured as it is, and its packets decode as RoCEv2 only where the
// reader is told to (Wireshark's Decode As).
//
// A device's UDP GSO write is written as its segments, each with the identification the kernel gives
// it, as a NIC sends them; tcpdump on the loopback interface shows the write unsegmented instead,
// as one datagram, since loopback never segments.
//
// Reader reads pcapng files back with their comments and direction flags.
//
// The package stands between goroce (the devices and the simulator) and the tools around it, as the
// other interop packages do; it imports the root package and sim, which is why it is not under wire.
package capture
