package congestion

import (
	"errors"
	"fmt"
	"time"

	"github.com/goroce/goroce/wire"
)

// Per-packet bytes the wire adds around what the requester builds. IEEE 802.3: 14-byte MAC header, 4-byte
// FCS, 8-byte preamble and SFD, 12-byte minimum inter-frame gap; IPv4 without options (RFC 791); UDP
// (RFC 768). A rate limiter that paces link occupancy must count all of them.
const (
	ethernetOverhead = 14 + 4 + 8 + 12
	ipv4HeaderLen    = 20

	// DefaultWireOverhead is the bytes per packet below the RoCEv2 transport headers on an IPv4 Ethernet
	// link: 38 of Ethernet framing, 20 of IPv4, 8 of UDP.
	DefaultWireOverhead = ethernetOverhead + ipv4HeaderLen + wire.UDPHeaderLen

	// DefaultHeaderBytes is the transport header bytes NextSend adds to a payload to estimate the packet
	// qp will build: BTH and ICRC (IBTA Vol 1 9.2, Annex A17.3.3). Extension headers (RETH on the first
	// WRITE packet, DETH) are not known at NextSend; OnSent charges the real length.
	DefaultHeaderBytes = wire.BTHLen + wire.ICRCLen

	// maxPayload is the largest IBTA path MTU (IBTA Vol 1 9.7.7 / 4096); the default burst is one such
	// packet, so a full-sized packet is never held back by the burst cap.
	maxPayload = 4096

	// paperLineRate is the link speed [P]'s parameters were chosen for (40 GbE); DefaultParams scales the
	// rate steps from it.
	paperLineRate = 40e9
)

// Params configures a DCQCN reaction point. Rates are bits per second on the wire. DefaultParams fills
// every field; a zero field is not a default.
type Params struct {
	// LineRate is the link rate: the initial rate (there is no slow start [P §3]) and the ceiling of both
	// the current and the target rate.
	LineRate float64
	// MinRate is the floor a rate cut never goes below. [S] MinRate; [NV] rpg_min_rate.
	MinRate float64

	// G is the α gain g of the CNP update α ← (1−g)α + g and the decay α ← (1−g)α. [P] §3 eq. (1)-(2).
	G float64
	// InitialAlpha is α before the first CNP. [NV] initial_alpha_value.
	InitialAlpha float64
	// AlphaInterval is K: α decays once per K without a CNP, counted from the last CNP. [P] §3, [S]
	// ResumeAlpha. α does not decay before the first CNP ([S] arms the timer on a CNP).
	AlphaInterval time.Duration

	// IncreaseInterval is T, the rate-increase timer period, counted from the last CNP. [P] §3 Fig. 7.
	IncreaseInterval time.Duration
	// ByteCounter is B: one increase event per B bytes sent (wire bytes) since the last CNP; 0 turns the
	// byte counter off. [P] §3 Fig. 7.
	ByteCounter int64
	// FastRecovery is F: the first F increase events after a cut (the larger of the two event counts up
	// to F) are fast recovery, RC ← (RT+RC)/2. Additive increase follows while either count is ≤ F; hyper
	// increase once both exceed F. [P] §3; see DefaultParams for the off-by-one against [S].
	FastRecovery int
	// RateAI is R_AI, the target-rate step of additive increase. [P] §3 eq. (3).
	RateAI float64
	// RateHAI is R_HAI: hyper increase adds i·R_HAI with i = min(T_c, B_c) − F. [P] §3 eq. (4).
	RateHAI float64

	// DecreaseInterval is the shortest time between two rate cuts; a CNP that arrives sooner after the
	// last cut is ignored (counted in Stats.CNPsIgnored) and changes nothing, α included. 0 lets every CNP
	// cut. [NV] rate_reduce_monitor_period.
	DecreaseInterval time.Duration
	// ClampTarget sets RT ← RC on every CNP, as [P] eq. (1) writes it ([S] CLAMP_TARGET_RATE 1,
	// [NV] clamp_tgt_rate). When false RT is reset only if an increase event happened since the last CNP
	// (the QCN rule; [NV] clamp_tgt_rate_after_time_inc).
	ClampTarget bool
	// CutWithNewAlpha updates α before the rate cut, as [S] rpr_cnm_received does; false cuts with the α
	// held before this CNP, in the order [P] eq. (1) writes.
	CutWithNewAlpha bool
	// HyperHalving halves the timer period and byte threshold after an event taken in hyper increase,
	// as [S] (and QCN) do; [P] does not describe it.
	HyperHalving bool

	// WireOverhead is the bytes per packet the link carries beyond what qp reports to OnSent (Ethernet
	// framing, IP, UDP). Pacing, the byte counter and Rate all count wire bytes.
	WireOverhead int
	// HeaderBytes is what NextSend adds to a payload, on top of WireOverhead, to estimate the packet's
	// transport headers.
	HeaderBytes int
	// Burst is the token bucket depth in wire bytes: the most that may leave back-to-back after an idle
	// period. A packet larger than Burst waits for a full bucket.
	Burst int
}

// DefaultParams returns the parameters of [P] (40 GbE) adapted to lineRate. Each default names its source;
// where the sources disagree or are UNCERTAIN the comment says which one was chosen and why.
func DefaultParams(lineRate float64) Params {
	scale := lineRate / paperLineRate
	p := Params{
		LineRate: lineRate,
		// [S] MinRate default 100 Mb/s; [NV] uses 1 Mb/s, which leaves a cut flow almost stopped.
		MinRate: 100e6,

		// [P] §5 and [S] DCTCP_GAIN 0.00390625. [NV] dce_tcp_g (1019/1024) differs; paper value kept.
		G: 1.0 / 256,
		// UNCERTAIN: [S] starts at 0.5, [NV] initial_alpha_value 1023 (≈1) and htsim at 1. Chosen 1: the
		// hardware most deployments run, and it makes the first cut a halving (rpg_min_dec_fac 50 %).
		InitialAlpha: 1,
		// [P] §3 (K = 55 µs > N = 50 µs) and [S] ALPHA_RESUME_INTERVAL 55.
		AlphaInterval: 55 * time.Microsecond,

		// UNCERTAIN: [P] §5 and the HPCC simulator's dcqcn_paper profile use 55 µs; [S]'s sample runs 60.
		IncreaseInterval: 55 * time.Microsecond,
		// UNCERTAIN: 10 MB ([P] §5 as reproduced by DCQCN-validation); decimal MB as ns-3 configs count.
		// Chosen so the timer, not the byte counter, drives recovery, which [P]'s fluid model found fair.
		ByteCounter: 10_000_000,
		// [P] §3 and [S] FAST_RECOVERY_TIMES 5. UNCERTAIN boundary: here the first F events are fast
		// recovery (QCN's five cycles, htsim, the paper's wording); [S] leaves fast recovery at its F-th
		// event, so [S] with FAST_RECOVERY_TIMES n behaves as FastRecovery n−1 here.
		FastRecovery: 5,
		// [P] and [S] RATE_AI 40 Mb/s at 40 Gb/s, scaled with the link speed as the HPCC simulator scales
		// its DCQCN steps (UNCERTAIN: [P] gives no rule for other speeds).
		RateAI: 40e6 * scale,
		// UNCERTAIN: [P]'s value was not read; [S]'s sample config uses 200 Mb/s (code default 50, htsim
		// line/10). Chosen 200 Mb/s = 5·R_AI at 40 Gb/s, the authors' own run; scaled like RateAI.
		RateHAI: 200e6 * scale,

		// [NV] rate_reduce_monitor_period 4 µs. [P] has no such limit (the NP's 50 µs spacing bounds CNPs),
		// so with one NP per flow this never fires; it guards against CNP bursts from several NPs.
		DecreaseInterval: 4 * time.Microsecond,
		// [P] eq. (1) and [S] CLAMP_TARGET_RATE 1.
		ClampTarget: true,

		WireOverhead: DefaultWireOverhead,
		HeaderBytes:  DefaultHeaderBytes,
		Burst:        maxPayload + DefaultHeaderBytes + DefaultWireOverhead,
	}
	if p.MinRate > lineRate {
		p.MinRate = lineRate
	}
	return p
}

// ErrParams is returned, wrapped with the offending field, for parameters a DCQCN cannot run with.
var ErrParams = errors.New("invalid congestion control parameters")

// Validate reports the first parameter a DCQCN cannot run with.
func (p *Params) Validate() error {
	bad := func(field string, v any) error { return fmt.Errorf("%w: %s = %v", ErrParams, field, v) }
	switch {
	case !(p.LineRate > 0):
		return bad("LineRate", p.LineRate)
	case !(p.MinRate > 0 && p.MinRate <= p.LineRate):
		return bad("MinRate", p.MinRate)
	case !(p.G > 0 && p.G <= 1):
		return bad("G", p.G)
	case !(p.InitialAlpha >= 0 && p.InitialAlpha <= 1):
		return bad("InitialAlpha", p.InitialAlpha)
	case p.AlphaInterval <= 0:
		return bad("AlphaInterval", p.AlphaInterval)
	case p.IncreaseInterval <= 0 || (p.HyperHalving && p.IncreaseInterval < 2):
		return bad("IncreaseInterval", p.IncreaseInterval)
	case p.ByteCounter < 0 || (p.HyperHalving && p.ByteCounter == 1):
		return bad("ByteCounter", p.ByteCounter)
	case p.FastRecovery < 0:
		return bad("FastRecovery", p.FastRecovery)
	case !(p.RateAI >= 0):
		return bad("RateAI", p.RateAI)
	case !(p.RateHAI >= 0):
		return bad("RateHAI", p.RateHAI)
	case p.DecreaseInterval < 0:
		return bad("DecreaseInterval", p.DecreaseInterval)
	case p.WireOverhead < 0:
		return bad("WireOverhead", p.WireOverhead)
	case p.HeaderBytes < 0:
		return bad("HeaderBytes", p.HeaderBytes)
	case p.Burst <= 0:
		return bad("Burst", p.Burst)
	}
	return nil
}
