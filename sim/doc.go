// Package sim is a deterministic discrete-event network simulator that runs goroce's real queue pair
// engines (package qp) over simulated links and switches, in virtual time.
//
// A run is a function of its seed: one PCG random source drives every random choice (fault draws,
// initial PSNs, ECN marking, workload mixes), events at the same virtual instant run in the order they
// were scheduled, and nothing reads the wall clock or iterates a map. The only nondeterminism that
// reaches the packets is the memory keys package mr draws from crypto/rand: rkeys, and so ICRCs, differ
// between runs of one seed, while every timing, drop, completion and statistic is the same.
//
// Packets on the simulated wire are real RoCEv2 datagrams: an IPv4 header (10.0.x.y addresses, which
// never reach a socket), a UDP header with a per-QP source port (rxe's flow-label formula), the
// transport packet the engine built, and an ICRC sealed over those headers with wire.SetICRC. Switches
// forward on the IP destination, spread flows over equal-cost paths by hashing the UDP 5-tuple, and mark
// Congestion Experienced in the IP TOS byte; receiving hosts parse and verify the whole datagram with
// wire.ParseIP, so a corrupted packet is dropped by the ICRC check exactly as a real NIC drops it, and
// pass CE to the engine in qp.RxInfo.
//
// The pieces:
//
//   - Sim: the virtual clock, the event queue and the random source (sim.go, event.go).
//   - Host: a NIC with one port that runs qp engines; Endpoint is one queue pair on it (host.go).
//   - Link and Port: rate, propagation delay, MTU, and fault models on each direction: independent and
//     Gilbert-Elliott loss, reordering, duplication, bit corruption, link down and up (link.go, fault.go).
//   - Switch: output-queued ports with tail drop, RED-style ECN marking and PFC (switch.go).
//   - Topologies (topo.go), workloads of WRITE, READ and SEND flows (flow.go), time series and CSV
//     (stats.go), SVG plots (svg.go), named scenarios (scenario.go) and the fault campaign (campaign.go)
//     that the tests and "goroce sim replay" run.
//
// Congestion control plugs in per host: HostConfig.Pacer gives each queue pair a qp.Pacer (a DCQCN
// reaction point), and HostConfig.CNP decides, for each CE-marked packet, whether the receiving host
// sends a congestion notification packet back to the sender's queue pair.
package sim
