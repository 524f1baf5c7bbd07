// Package perf measures goroce against what its users would use instead, on loopback: the
// machinery behind `goroce perf loopback`, which is a thin shell over it.
//
// Two kinds of measurement run side by side. In one process, as the command always did, two goroce
// devices stream RDMA WRITEs and play SEND ping-pong next to the raw UDP path of internal/conn
// (RawThroughput, RawPingPong). In two processes, which is how goroce is used, the parent
// re-executes its own binary as a child and drives it over a control channel: goroce RDMA WRITE
// (with GSO and with one datagram per packet), READ and SEND over one and several queue pairs,
// a Go TCP stream, raw UDP datagrams the size of a WRITE MIDDLE packet sent one per packet and in
// GSO runs to a GRO receiver, and SEND and raw UDP ping-pongs.
//
// # Control channel
//
// The child reads requests from its stdin and writes replies to its stdout, one JSON object a line,
// one request at a time (see request and reply in proto.go). It first says hello; then the parent
// starts a measurement ("start", with the parameters and what the child needs of the parent's
// side), the child sets up its side and replies with what the parent needs (QPNs, PSNs, GIDs and a
// memory region's address and rkey for goroce; an address for TCP and UDP); "mark" tells the child
// that the timed interval began; "stop" ends the measurement and brings back the child's counters.
// The child exits when its stdin ends, so it never outlives the parent. The parent bounds every
// call with a timeout and kills a child that does not exit after its stdin closed.
//
// # Runs and statistics
//
// Run executes every measurement Runs times, interleaved (A B C A B C ...) so that a change of
// machine load hits them alike, and Report summarizes each by its median over the runs with the
// range; a ratio of two measurements is computed within each run and summarized the same way.
package perf
