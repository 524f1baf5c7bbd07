//go:build !goroce_systrace

package conn

// Without the goroce_systrace build tag the system calls are not recorded: see systrace_on.go.

const systraceOn = false

type sysKind uint8

const (
	sysSend sysKind = iota
	sysSent
	sysRecv
	sysRecvData
	sysRecvEmpty
)

func systrace(sysKind, uintptr) {}

// SyscallProfile returns "": build with -tags goroce_systrace for the medians of the time spent in and
// between the datagram system calls.
func SyscallProfile() string { return "" }
