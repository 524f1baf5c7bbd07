package cm

import "time"

// Timeout returns the time a 5-bit CM timeout code stands for: 4.096 µs × 2^code. Every timeout field of
// chapter 12 uses this unit (REQ's Remote and Local CM Response Timeout, MRA's Service Timeout, the
// path's Local ACK Timeout, REP's Target ACK Delay). IBTA Vol 1 12.6.5 (Table 106). Codes above 31 are
// cut to 31. Linux approximates it as 2^(code-8) ms (cm_convert_to_ms); this is the exact value.
func Timeout(code uint8) time.Duration {
	return 4096 * time.Nanosecond << min(code, 31)
}

// ACKTimeout returns the local ACK timeout code of a QP whose path has the given packet lifetime
// towards a CA with the given ACK delay: 4.096 µs × 2^t ≥ ACK delay + 2 × packet lifetime, rounded
// to a code the way Linux's cm_ack_timeout (drivers/infiniband/core/cm.c) rounds it, so that both
// ends of a connection compute what rxe does.
func ACKTimeout(caACKDelay, packetLifeTime uint8) uint8 {
	packetLifeTime = min(packetLifeTime, 31)
	t := packetLifeTime + 1
	if t >= caACKDelay {
		if caACKDelay >= t-1 {
			t++
		}
	} else {
		t = caACKDelay
		if packetLifeTime+1 >= caACKDelay-1 {
			t++
		}
	}
	return min(t, 31)
}

// Defaults of Config, each the value Linux's rdma_cm uses (drivers/infiniband/core/cma.c) so that
// goroce's timing matches an rxe peer's.
const (
	// DefaultPacketLifeTime is the packet lifetime code of a RoCE path: 18, 1.07 s
	// (CMA_IBOE_PACKET_LIFETIME).
	DefaultPacketLifeTime = 18
	// DefaultCMResponseTimeout is the code both REQ response timeouts carry: 20, 4.3 s
	// (CMA_CM_RESPONSE_TIMEOUT).
	DefaultCMResponseTimeout = 20
	// DefaultMaxCMRetries is how many times a REQ, REP or DREQ is resent (CMA_MAX_CM_RETRIES).
	DefaultMaxCMRetries = 15
	// DefaultACKDelay is the CA ACK delay code a REP reports: 15, rxe's local_ca_ack_delay (its REP in
	// rping.pcap carries it).
	DefaultACKDelay = 15
	// DefaultMRATimeout is the service timeout code of the MRAs the engine sends while its owner thinks:
	// 24, 68.7 s (CMA_CM_MRA_SETTING).
	DefaultMRATimeout = 24
	// DefaultOwnerTimeout bounds how long a request or a reply waits for the owner's answer before the
	// engine rejects it with RejTimeout; it is shorter than DefaultMRATimeout's 68.7 s, so the peer
	// hears the REJ before it gives up on its own.
	DefaultOwnerTimeout = 60 * time.Second
	// DefaultMaxConns bounds the connections an engine holds at once, in every state.
	DefaultMaxConns = 256
	// DefaultBacklog bounds the requests of one listener the owner has not answered yet, as listen(2)'s
	// backlog does.
	DefaultBacklog = 64
	// DefaultHopLimit is the hop limit of a REQ's path (the IP TTL rxe's REQ in rping.pcap carries).
	DefaultHopLimit = 64
)
