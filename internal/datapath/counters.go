package datapath

import (
	"sync/atomic"

	"github.com/goroce/goroce/internal/conn"
	"github.com/goroce/goroce/wire"
)

// counters are the datapath's own, outside any QP.
type counters struct {
	rxPackets, rxBytes, txPackets, txBytes                  atomic.Uint64
	dropMalformed, dropICRC, dropUnknownQPN, dropWrongPeer  atomic.Uint64
	dropTruncated, dropNoRoute, rxErrors, dropNotReady      atomic.Uint64
	cnpSent, ceRcvd                                         atomic.Uint64
	txGSO, gsoFallback, rxGRO, rxOffShard, steerFailed      atomic.Uint64
	drivenWaits, parkedWaits, handovers                     atomic.Uint64
	rxMADs, txMADs, dropGSI                                 atomic.Uint64
	drains, deadlineArms, deadlineWakes, staleWakes, yields atomic.Uint64
	busyPolls, busyPollMisses                               atomic.Uint64
	joinFailed                                              atomic.Uint64
}

// Stats are the datapath's counters.
type Stats struct {
	RxPackets, RxBytes, TxPackets, TxBytes uint64
	DropMalformed                          uint64 // failed wire.Parse: truncated, bad opcode, bad lengths
	DropICRC                               uint64 // ICRC mismatch
	DropUnknownQPN                         uint64 // no QP with the destination QPN
	DropWrongPeer                          uint64 // an RC/UC packet from another address than the QP's peer
	DropNotReady                           uint64 // an RC/UC packet for a QP not yet given its peer (before RTR)
	DropTruncated                          uint64 // datagram larger than a receive buffer
	DropNoRoute                            uint64 // a packet to a GID with no usable address
	RxErrors                               uint64 // receive errors other than a closed socket
	CERcvd                                 uint64 // packets that arrived marked Congestion Experienced
	CNPSent                                uint64 // congestion notification packets sent
	TxGSO                                  uint64 // GSO writes: runs of packets sent with one system call
	GSOFallback                            uint64 // GSO writes the kernel refused and that went out packet by packet
	RxGRO                                  uint64 // coalesced runs received
	RxOffShard                             uint64 // packets a shard read for a QP of another shard
	SteerFailed                            uint64 // 1 if the kernel refused to steer by QPN
	Shards                                 uint64 // receive sockets taking datagrams: the first, and each other from its shard's first QP on (Datapath.join)
	ShardJoinFailed                        uint64 // shards whose socket could not join the group; their QPs went to the first shard
	DrivenWaits                            uint64 // CQ waits that drove their shard
	ParkedWaits                            uint64 // CQ waits that parked until a driver notified them
	Handovers                              uint64 // waits that had to interrupt another driver first
	TimerDrains                            uint64 // batches read without waiting before due timers fired (drainBeforeTimers)
	DeadlineArms                           uint64 // read deadlines set: each moves a Go runtime timer, which wakes a thread
	DeadlineWakes                          uint64 // reads that returned because their deadline passed
	StaleWakes                             uint64 // deadline wakes that found no timer due: the deadline had moved out (see shard.arm)
	Yields                                 uint64 // times a busy driver gave up its processor to let the scheduler poll the network (shard.yield)
	BusyPolls                              uint64 // reads that found packets while a waiter polled (Config.BusyPoll)
	BusyPollMisses                         uint64 // polls that found nothing in Config.BusyPoll, after which the waiter slept
	RxMADs                                 uint64 // MADs received on QP1 and handed to Config.GSI
	TxMADs                                 uint64 // MADs sent from QP1 (SendMAD)
	DropGSI                                uint64 // packets for QP1 that are not MADs (DropGSI)
	Conn                                   conn.Stats
}

// Stats returns a snapshot of the counters.
func (d *Datapath) Stats() Stats {
	c := &d.stats
	s := Stats{
		RxPackets: c.rxPackets.Load(), RxBytes: c.rxBytes.Load(), TxPackets: c.txPackets.Load(), TxBytes: c.txBytes.Load(),
		DropMalformed: c.dropMalformed.Load(), DropICRC: c.dropICRC.Load(), DropUnknownQPN: c.dropUnknownQPN.Load(),
		DropWrongPeer: c.dropWrongPeer.Load(), DropNotReady: c.dropNotReady.Load(), DropTruncated: c.dropTruncated.Load(), DropNoRoute: c.dropNoRoute.Load(),
		RxErrors: c.rxErrors.Load(), CERcvd: c.ceRcvd.Load(), CNPSent: c.cnpSent.Load(),
		TxGSO: c.txGSO.Load(), GSOFallback: c.gsoFallback.Load(), RxGRO: c.rxGRO.Load(), RxOffShard: c.rxOffShard.Load(),
		SteerFailed: c.steerFailed.Load(), ShardJoinFailed: c.joinFailed.Load(), DrivenWaits: c.drivenWaits.Load(), ParkedWaits: c.parkedWaits.Load(),
		Handovers: c.handovers.Load(), RxMADs: c.rxMADs.Load(), TxMADs: c.txMADs.Load(), DropGSI: c.dropGSI.Load(), TimerDrains: c.drains.Load(),
		DeadlineArms: c.deadlineArms.Load(), DeadlineWakes: c.deadlineWakes.Load(), StaleWakes: c.staleWakes.Load(), Yields: c.yields.Load(),
		BusyPolls: c.busyPolls.Load(), BusyPollMisses: c.busyPollMisses.Load(),
	}
	for _, sh := range d.shards {
		if cs, ok := conn.StatsOf(sh.conn); ok {
			s.Conn = s.Conn.Add(cs)
		}
	}
	d.mu.Lock()
	for _, sh := range d.shards {
		if sh.joined {
			s.Shards++
		}
	}
	for _, p := range d.ports {
		if p != nil {
			if cs, ok := conn.StatsOf(p.conn); ok {
				s.Conn = s.Conn.Add(cs)
			}
		}
	}
	d.mu.Unlock()
	return s
}

// QPs calls f for every QP.
func (d *Datapath) QPs(f func(*QP)) {
	d.qps.Range(func(_, v any) bool {
		f(v.(*QP))
		return true
	})
}

// SourcePorts returns the UDP source port of every QP, by QPN.
func (d *Datapath) SourcePorts() map[wire.QPN]uint16 {
	m := make(map[wire.QPN]uint16)
	d.QPs(func(q *QP) { m[q.qpn] = q.port.num })
	return m
}
