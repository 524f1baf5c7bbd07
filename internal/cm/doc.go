// Package cm is goroce's communication manager: the InfiniBand CM of IBTA Vol 1 chapter 12 that RDMA
// CM (librdmacm, the kernel's rdma_cm) speaks, as a state machine that does no I/O. It sets up and
// tears down connections for the device's QPs, active (Dial) and passive (Listen), and resolves service
// IDs to UD QPs (SIDR). Package wire/mad encodes and decodes its messages.
//
// # The engine
//
// An Engine takes received MADs and the time, and gives back MADs to send and events for its owner, in
// the style of package qp:
//
//	e := cm.NewEngine(cm.Config{LocalGID: gid, CAGUID: guid, Seed: seed})
//	e.Listen(mad.ServiceID(mad.PortSpaceTCP, 7471), 0)       // passive
//	id, err := e.Connect(now, &cm.ConnectParams{...})        // active: a REQ
//	e.HandleMAD(now, fromGID, payload)                      // a MAD in
//	e.Advance(now)                                          // timers: resends, timeouts, timewait
//	to, b, ok := e.PollMAD(buf[:0])                         // a MAD out, to a GID
//	ev, ok := e.PollEvent()                                 // an event for the owner
//	e.NextDeadline()                                        // when Advance next has work
//
// and the owner answers events with Accept, Reject, Confirm, Disconnect, Establish, AnswerSIDR or
// Abort. Nothing inside reads a clock, starts a goroutine or touches a socket, so the engine runs
// under the device on the real clock and in this package's tests on a manual one, two engines joined by
// an in-memory link that loses, duplicates and delays MADs (link_test.go).
//
// # The state machine
//
// state.go holds one table of the legal transitions. In short:
//
//	active:  IDLE -Connect/REQ-> REQ_SENT -REP-> REP_RCVD (EventReply) -Confirm/RTU-> ESTABLISHED
//	passive: IDLE -REQ-> REQ_RCVD (EventRequest) -Accept/REP-> REP_SENT -RTU-> ESTABLISHED (EventEstablished)
//	either:  ESTABLISHED -Disconnect/DREQ-> DREQ_SENT -DREP-> TIMEWAIT -> IDLE (EventTimewaitDone)
//	         ESTABLISHED -DREQ/DREP-> TIMEWAIT (EventDisconnected, Remote)
//	UD:      IDLE -Resolve/SIDR_REQ-> SIDR_REQ_SENT -SIDR_REP-> IDLE (EventSIDRResolved)
//	         IDLE -SIDR_REQ-> SIDR_REQ_RCVD (EventSIDRRequest) -AnswerSIDR/SIDR_REP-> SIDR_REP_SENT -> IDLE
//
// A REQ, REP or DREQ is resent every 2 × packet lifetime + the peer's CM response timeout (4.096 µs ×
// 2^t each; 6.4 s with rdma_cm's values), a SIDR_REQ every CM response timeout, up to Max CM Retries
// times (15: Config's, and the REQ's for the passive side's REP); an MRA stretches the wait by its
// service timeout. When the retries run out the peer is taken to have vanished: EventUnreachable, and a REJ with
// reason timeout whose ARI is this CA's GUID, or timewait for a DREQ. The engine sends an MRA itself
// when a REQ or REP is repeated while its owner is still deciding, and rejects with reason timeout when
// the owner takes longer than Config.OwnerTimeout. REJ ends an attempt at every stage (EventRejected),
// to idle or, once the peer may hold a connected QP, to timewait. Duplicates are answered from what
// was sent: a REQ with the MRA or the REP again, a REP with the RTU or the MRA, a DREQ in timewait with
// the DREP, a SIDR_REQ with the SIDR_REP. Messages of no connection are answered as chapter 12 and
// Linux do (REQ for a service nobody listens on: REJ invalid service ID; REP: REJ invalid comm ID;
// DREQ: DREP) or dropped (RTU, DREP, MRA, REJ); a REQ or REP from a QP still connected under another
// ID gets REJ stale connection and the old connection is disconnected. Every drop is counted by reason
// (Counters); malformed input is dropped, never a panic. Connections are bounded (Config.MaxConns), so
// are a listener's unanswered requests (its backlog: beyond it REQs are dropped for the peer to retry),
// and so are the outgoing and event queues, which grow only as needed.
//
// # How the device uses it
//
// The device owns one Engine, behind a lock or on one goroutine, and:
//
//   - QP1 in: UD SEND_ONLY packets to QPN 1 whose DETH Q_Key is wire.GSIQKey (0x80010000) carry a MAD
//     as their 256-byte payload; the datapath hands the payload and the sender's GID (its IP address)
//     to HandleMAD. MADs of other classes (the SA, performance management) are the device's to drop.
//   - QP1 out: after every call it drains PollMAD and sends each MAD as a UD SEND_ONLY from QPN 1 to
//     QPN 1 at the GID PollMAD names, Q_Key GSIQKey, P_Key 0xFFFF, to UDP port 4791; rxe's QP1 answers
//     to the source it saw. The MAD's own transaction ID, resends and duplicates are the engine's.
//   - Time: one timer re-armed at NextDeadline, calling Advance, on the device's Clock.
//   - QPs: for Dial, a QP created (RESET or INIT) before Connect names its QPN and the PSN it expects;
//     on EventReply, qp.Connect with the event's QPParams (mapped to qp.ConnectParams: DestQPN, SQPSN,
//     RQPSN, PathMTU, Timeout, RetryCnt, RNRRetry, RdAtomic from MaxRdAtomic and MaxDestRdAtomic, the
//     peer's address from Peer), then Confirm. For Listen, on EventRequest the listener queues the
//     request for Accept; accepting creates a QP, calls Accept, connects the QP with what Accept
//     returns, then sends the queued REP (drain PollMAD after connecting). On EventDisconnected or
//     EventRejected, move the QP to the error state; destroy or reuse it after EventTimewaitDone.
//   - rdma_cm's conventions are the device's: the service ID of a port (mad.ServiceID with
//     mad.PortSpaceTCP for RC, mad.PortSpaceUDP for UD), the CMA header before the application's
//     private data in a REQ or SIDR_REQ (mad.CMAHeaderFields.Append: version 0, the IP version, the
//     active side's port and both addresses) and stripped from it on the passive side
//     (mad.ParseCMAHeader), rejecting with mad.RejConsumerReject what the application refuses.
//
// # The API this is for (proposed)
//
//	ln, err := dev.Listen(7471)                  // RDMA_PS_TCP port 7471; ListenUD for SIDR
//	c, err := ln.Accept(ctx)                     // a *Conn: connected QP, its CQs, the peer's private data
//	c, err := dev.Dial(ctx, "10.0.0.2:7471", &goroce.DialOptions{PrivateData: p, ...})
//	c.QP(), c.PrivateData(), c.RemoteAddr()
//	err = c.Close()                              // Disconnect (DREQ), wait for DREP or timeout, destroy after timewait
//	<-c.Done()                                   // the peer disconnected (its DREQ)
//
// Dial's errors match with errors.Is: goroce.ErrConnRefused for a REJ, as a *goroce.RejectError that
// carries the mad.RejectReason, the ARI and the peer's private data (rdma_reject's); the context's
// error when ctx ends first (the engine is then told Abort); goroce.ErrUnreachable (wrapping
// os.ErrDeadlineExceeded) when the REQ's retries run out. Listener.Accept's ctx bounds the wait for a
// request, not the handshake: a request not accepted within Config.OwnerTimeout is rejected for the
// application. Listener.Close stops new requests (Unlisten) and rejects the queued ones.
package cm
