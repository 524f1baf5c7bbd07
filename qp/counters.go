package qp

import (
	"reflect"

	"github.com/goroce/goroce/wire"
)

// Counters are a queue pair's statistics. Where rxe has a hardware counter for the same event
// (drivers/infiniband/sw/rxe/rxe_hw_counters.c), the field's tag says its name, and where only mlx5
// has one (its hw_counters, shown by `rdma statistic` too), the mlx5 name; Each reports those names.
// The comments give mlx5's name for a counter rxe names differently.
type Counters struct {
	SentPkts            uint64 `rxe:"sent_pkts"`
	RcvdPkts            uint64 `rxe:"rcvd_pkts"`
	DuplicateRequest    uint64 `rxe:"duplicate_request"`      // responder: requests behind the expected PSN
	OutOfSeqRequest     uint64 `rxe:"out_of_seq_request"`     // responder: requests ahead of the expected PSN (mlx5: out_of_sequence)
	RcvdRNRErr          uint64 `rxe:"rcvd_rnr_err"`           // requester: RNR NAKs received (mlx5: rnr_nak_retry_err)
	SendRNRErr          uint64 `rxe:"send_rnr_err"`           // responder: RNR NAKs sent
	RcvdSeqErr          uint64 `rxe:"rcvd_seq_err"`           // requester: PSN sequence error NAKs received (mlx5: packet_seq_err)
	CompleterRetryErr   uint64 `rxe:"completer_retry_err"`    // requester: go-back-N retransmissions started
	RetryExceededErr    uint64 `rxe:"retry_exceeded_err"`     // requester: retry_cnt ran out
	RetryRNRExceededErr uint64 `rxe:"retry_rnr_exceeded_err"` // requester: rnr_retry ran out
	AckDeferred         uint64 `rxe:"ack_deferred"`           // responder: in-order requests without AckReq
	SendErr             uint64 `rxe:"send_err"`               // requester: requests failed before the wire

	Timeouts      uint64    `mlx5:"local_ack_timeout_err"` // local ACK timeouts that started a retransmission
	TailProbes    uint64    // tail-loss probes sent (Config.TailProbe)
	ProbeRetries  uint64    // go-back-N resends a probe's answer started
	ImpliedNAKs   uint64    `mlx5:"implied_nak_seq_err"` // responses past a READ or atomic whose response is missing
	RetryIgnored  uint64    // NAKs and implied NAKs that arrived while a retry was already under way
	CQOverflow    uint64    // completions lost to a full CQ
	InvalidateErr uint64    // SEND_WITH_INV naming a key that could not be invalidated
	FatalNAKs     uint64    // NAKs sent that ended the connection
	NAKsSent      [8]uint64 // NAKs sent, by NAK code (PSN sequence error, invalid request, ...)
	RcvdCE        uint64    `mlx5:"np_ecn_marked_roce_packets"` // packets that arrived marked Congestion Experienced
	RcvdCNP       uint64    `mlx5:"rp_cnp_handled"`             // congestion notification packets received (the reaction point's)

	Dropped               uint64 // every packet dropped, whatever the reason below
	DropState             uint64 // the QP's state does not take the packet
	DropWrongTransport    uint64 // an opcode of another service than the QP's
	DropPKey              uint64 // P_Key mismatch
	DropGhostResponse     uint64 // a response for a PSN never sent
	DropStaleResponse     uint64 // a response for a PSN already acknowledged
	DropBadResponse       uint64 // a response of the wrong kind for what is outstanding
	DropResponseQueueFull uint64 // a request that would queue more responses than the ring holds
	DropDuplicate         uint64 // a duplicate with nothing to answer it with
	DropUCMessage         uint64 // UC packets of a message lost to a gap or an error
	DropNoRecv            uint64 // UC or UD messages with no receive posted
	DropQKey              uint64 // UD Q_Key mismatch
	DropRecvTooSmall      uint64 // UD datagrams larger than the posted receive
}

func (c *Counters) drop(reason *uint64) {
	*reason++
	c.Dropped++
}

// Each calls fn with every counter's name and value: rxe's name where it has one, else mlx5's, else the
// Go field name (and the NAK code for NAKsSent).
func (c *Counters) Each(fn func(name string, v uint64)) {
	v := reflect.ValueOf(c).Elem()
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name := f.Tag.Get("rxe")
		if name == "" {
			name = f.Tag.Get("mlx5")
		}
		if name == "" {
			name = f.Name
		}
		if f.Type.Kind() == reflect.Array {
			for k := 0; k < f.Type.Len(); k++ {
				if x := v.Field(i).Index(k).Uint(); x > 0 {
					fn(name+"["+wire.NAKCode(k).String()+"]", x)
				}
			}
			continue
		}
		fn(name, v.Field(i).Uint())
	}
}

// Add adds o's counts to c, for per-device totals.
func (c *Counters) Add(o *Counters) {
	v, w := reflect.ValueOf(c).Elem(), reflect.ValueOf(o).Elem()
	for i := 0; i < v.NumField(); i++ {
		f := v.Field(i)
		if f.Kind() == reflect.Array {
			for k := 0; k < f.Len(); k++ {
				f.Index(k).SetUint(f.Index(k).Uint() + w.Field(i).Index(k).Uint())
			}
			continue
		}
		f.SetUint(f.Uint() + w.Field(i).Uint())
	}
}
