package explain

import (
	"strings"

	"github.com/goroce/goroce/wire"
)

// opcodeNames holds OpcodeName's answer for every opcode, built once from the opcode table.
var opcodeNames [256]string

func init() {
	for i := range opcodeNames {
		opcodeNames[i] = wiresharkName(wire.Opcode(i))
	}
}

// OpcodeName returns the name Wireshark's InfiniBand dissector gives the opcode in its Info column, the
// name people who read captures know: "RC Send Only", "RC RDMA Read Response First", "RC Acknowledge",
// "UD Send Only Immediate", "CNP". It is the IBTA name of wire's opcode table in Wireshark's spelling:
// the transport, then the words capitalized, "RDMA" kept, "WITH" dropped. Wireshark 4.0 names every RC,
// UC and UD opcode so; it has no name for FLUSH and ATOMIC_WRITE (0x1C, 0x1D) or the CNP (0x81), which
// get the same spelling ("RC Flush", "RC Atomic Write") and "CNP". An opcode wire does not know is
// "Opcode(0xNN)".
func OpcodeName(op wire.Opcode) string { return opcodeNames[op] }

func wiresharkName(op wire.Opcode) string {
	i := op.Info()
	if !i.Valid() {
		return op.String()
	}
	if i.Transport == wire.TransportCNP {
		return "CNP"
	}
	var b strings.Builder
	b.WriteString(i.Transport.String())
	for w := range strings.SplitSeq(i.Name, "_") {
		switch w {
		case "WITH":
			continue
		case "RDMA":
		default:
			w = w[:1] + strings.ToLower(w[1:])
		}
		b.WriteByte(' ')
		b.WriteString(w)
	}
	return b.String()
}
