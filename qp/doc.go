// Package qp holds goroce's queue pair engines: the RC, UC and UD transports of the InfiniBand
// Architecture (IBTA Vol 1 chapters 9 and 10) as plain state machines that do no I/O.
//
// A QP takes the time and its inputs as arguments and returns what to send:
//
//	q.PostSend(now, &wr)              // a work request in
//	q.HandlePacket(now, pkt, info)    // a packet in (already parsed and ICRC-checked)
//	q.Advance(now)                    // timers: retransmission, RNR waits
//	out, tx, ok := q.AppendPacket(now, buf) // a packet out, with a zero ICRC for the datapath to seal
//	q.NextDeadline()                  // when it next needs Advance
//
// and completions go to its CQs. Nothing inside reads a clock, starts a goroutine or touches a socket,
// so the same engines run under the device (package goroce) on the real clock, in this package's tests
// on a manual clock (link_test.go: two engines, a packet ladder, hooks that drop, duplicate, reorder and
// rewrite packets), and in the simulator (package sim) in virtual time.
//
// Roles are split by file, as in gVisor's tcp package: requester.go turns work requests into request
// packets (segmentation, PSNs, AckReq, the PSN window, initiator depth, fences, pacing); completer.go
// turns responses into completions (ACK coalescing, implied NAKs, go-back-N, retry and RNR counters,
// the local ACK timer); responder.go executes requests (PSN, opcode sequence, access, resources, length
// and key checks in the order rxe makes them; READ and atomic replay from responder resources; ACK/NAK
// generation). state.go is the one state machine with ibv_modify_qp's rules; cq.go and srq.go the shared
// queues. CONFORMANCE.md maps the transport conformance scenarios to the tests that cover them.
//
// A QP is owned by one goroutine at a time; its CQs and SRQ are the locked hand-off points. The steady
// state allocates nothing (TestEngineZeroAllocs).
package qp
