package wire

import "testing"

func TestPacketText(t *testing.T) {
	for _, tc := range []struct {
		f       Fields
		payload int
		want    string
	}{
		{Fields{BTH: BTHFields{Opcode: RCSendFirst, DestQP: 0x11, PSN: 0x10b60a}}, 1024,
			"RC SEND_FIRST qp=0x000011 psn=0x10b60a payload=1024"},
		{Fields{BTH: BTHFields{Opcode: RCAcknowledge, DestQP: 0x11, PSN: 0x10b60d}, AETH: AETHFields{Syndrome: 0x1F, MSN: 1}}, 0,
			"RC ACKNOWLEDGE qp=0x000011 psn=0x10b60d ACK msn=1"},
		{Fields{BTH: BTHFields{Opcode: RCAcknowledge, PSN: 5}, AETH: AETHFields{Syndrome: SyndromeRNR(12)}}, 0,
			"RC ACKNOWLEDGE qp=0x000000 psn=0x000005 RNR NAK 0.64ms msn=0"},
		{Fields{BTH: BTHFields{Opcode: RCReadRequest, DestQP: 0x22, PSN: 0x100, AckReq: true},
			RETH: RETHFields{VA: 0x7f0000001000, RKey: 0x12345678, DMALen: 8192}}, 0,
			"RC RDMA_READ_REQUEST qp=0x000022 psn=0x000100 ack-req va=0x7f0000001000 rkey=0x12345678 len=8192"},
		{Fields{BTH: BTHFields{Opcode: RCCompareSwap, DestQP: 1}, AtomicETH: AtomicETHFields{VA: 8, RKey: 1, Compare: 2, SwapAdd: 3}}, 0,
			"RC COMPARE_SWAP qp=0x000001 psn=0x000000 va=0x8 rkey=0x00000001 compare=0x2 swap=0x3"},
		{Fields{BTH: BTHFields{Opcode: UDSendOnlyImm, DestQP: 1, SolicitedEvent: true}, DETH: DETHFields{QKey: GSIQKey, SrcQP: 1}, Imm: 9}, 3,
			"UD SEND_ONLY_WITH_IMMEDIATE qp=0x000001 psn=0x000000 se qkey=0x80010000 src-qp=0x000001 imm=0x00000009 payload=3"},
		{Fields{BTH: BTHFields{Opcode: CNP, DestQP: 0x11, BECN: true}}, 0,
			"CNP qp=0x000011 psn=0x000000 becn"}, // Wireshark's name, not "CNP CNP"
	} {
		b, err := Append(nil, &tc.f, make([]byte, tc.payload))
		if err != nil {
			t.Fatal(err)
		}
		p, err := Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.String(); got != tc.want {
			t.Errorf("got  %q\nwant %q", got, tc.want)
		}
	}
}
