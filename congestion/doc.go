// Package congestion holds RoCEv2 congestion control: the DCQCN reaction point that paces a requester QP
// (rp.go), the notification point that turns CE-marked packets into CNPs (np.go) and the RED-style marking
// policy of a congestion point, for the simulator's switches (cp.go).
//
// Everything here is sans-IO and time-injected: no goroutines, no clocks, no I/O. Every method that
// depends on time takes now, so the same code runs under the device loop, on manual time in tests and
// in sim. A controller's timers fire when its owner calls OnTimer at or after NextDeadline, and any call
// that takes now also applies the timers that are due, so an owner that never calls OnTimer still sees
// correct behaviour at each call.
//
// References, named in comments as [P], [S] and [NV]:
//   - [P] Y. Zhu et al., "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM 2015, §3 and §5.
//   - [S] the authors' ns-3 simulator, github.com/bobzhuyb/ns3-rdma,
//     src/point-to-point/model/qbb-net-device.cc (rpr_cnm_received, rpr_*_time, rpr_*_byte, AdjustRates,
//     ResumeAlpha, CheckandSendQCN) and src/network/model/broadcom-node.cc (ShouldSendCN).
//   - [NV] NVIDIA ConnectX DCQCN firmware parameters (DOCA "DCQCN CC Parameters"), e.g.
//     rate_reduce_monitor_period, initial_alpha_value, clamp_tgt_rate.
//
// The CNP itself is IBTA Annex A17.9.3 (RoCEv2); its encoding lives in package wire.
package congestion
