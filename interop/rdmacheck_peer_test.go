//go:build interop

package interop

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/interop/lab"
	"github.com/goroce/goroce/wire"
)

// The goroce side of rdmacheck (interop/rdmacheck/rdmacheck.c, which documents the protocol). The
// test binary re-executes itself inside the lab's namespace, as the tests run goroce there, with
// rdmacheckEnv set: init then runs the peer instead of the tests. One goroce device serves all the
// connections of one run, each with its own QP, CQ and MR, all at the same time.

// rdmacheckEnv, when set, makes the test binary a goroce rdmacheck peer; see rdmacheckPeerMain.
const rdmacheckEnv = "GOROCE_RDMACHECK_PEER"

func init() {
	if os.Getenv(rdmacheckEnv) != "" {
		os.Exit(rdmacheckPeerMain(os.Args[1:]))
	}
}

// rdmacheck's operations and phases, as rdmacheck.c numbers them.
const (
	opDone uint32 = iota
	opSendImm
	opWrite
	opWriteImm
	opRead
	opFetchAdd
	opCmpSwap
)

var opNames = []string{"done", "send_imm", "write", "write_imm", "read", "fetch_add", "cmp_swap"}

const (
	phasePrep uint32 = iota
	phaseVerify
)

// checkBufLen is the size of each side's buffer: the largest message and the byte after it.
const checkBufLen = 1<<20 + 8

// checkInfo is struct info: what the peers exchange to connect, big-endian on TCP.
type checkInfo struct {
	QPN, PSN, RKey, Len uint32
	Addr                uint64
	GID                 [16]byte
}

// checkCmd is struct cmd. A is the immediate or the atomic's initial memory, B the compare value or
// addend, C the swap value.
type checkCmd struct {
	Op, Phase, Size, K uint32
	A, B, C            uint64
}

// checkConn is one rdmacheck connection: a QP and its buffer, and the TCP connection to the peer.
type checkConn struct {
	tcp  net.Conn
	qp   *goroce.QP
	cq   *goroce.CQ
	mr   *goroce.MR
	buf  []byte
	seed uint32
	peer checkInfo
	log  func(format string, args ...any)
}

func (c *checkConn) pat(k uint32, i int) byte { return byte(uint32(i)*31 + k*7 + c.seed) }

// fill writes the message of check k to buf[:n], or its complement.
func (c *checkConn) fill(k uint32, n int, complement bool) {
	x := byte(0)
	if complement {
		x = 0xff
	}
	for i := range n {
		c.buf[i] = c.pat(k, i) ^ x
	}
}

// checkData checks that buf holds the message of check k and that the byte after it was not written.
func (c *checkConn) checkData(what string, k uint32, n int) error {
	for i := range n {
		if c.buf[i] != c.pat(k, i) {
			return fmt.Errorf("%s: byte %d is %#02x, want %#02x", what, i, c.buf[i], c.pat(k, i))
		}
	}
	if c.buf[n] != c.pat(k, n)^0xff {
		return fmt.Errorf("%s: byte %d after the message was written", what, n)
	}
	return nil
}

// poll waits up to 30 s for one completion and checks its status.
func (c *checkConn) poll(what string) (goroce.Completion, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	wc := make([]goroce.Completion, 1)
	if _, err := c.cq.Wait(ctx, wc); err != nil {
		return wc[0], fmt.Errorf("%s: no completion: %w", what, err)
	}
	if wc[0].Status != goroce.StatusSuccess {
		return wc[0], fmt.Errorf("%s: completion status %v", what, wc[0].Status)
	}
	return wc[0], nil
}

func (c *checkConn) mem64() uint64 { return binary.NativeEndian.Uint64(c.buf) }

// serve answers the client's commands until it is done and returns the number of checks verified.
func (c *checkConn) serve() (int, error) {
	n := 0
	for {
		var cmd checkCmd
		if err := binary.Read(c.tcp, binary.BigEndian, &cmd); err != nil {
			return n, err
		}
		if cmd.Op == opDone || cmd.Op >= uint32(len(opNames)) {
			return n, nil
		}
		err := c.serveOne(cmd)
		status := uint32(0)
		if err != nil {
			status = 1
		}
		if werr := binary.Write(c.tcp, binary.BigEndian, status); err == nil && werr != nil {
			err = werr
		}
		if err != nil {
			return n, err
		}
		if cmd.Phase == phaseVerify {
			c.log("server %s size %d: ok", opNames[cmd.Op], cmd.Size)
			n++
		}
	}
}

func (c *checkConn) serveOne(cmd checkCmd) error {
	name, size := opNames[cmd.Op], int(cmd.Size)
	if cmd.Phase == phasePrep {
		switch cmd.Op {
		case opSendImm, opWriteImm, opWrite:
			if cmd.Op != opWrite {
				if err := c.qp.PostRecv(&goroce.RecvWR{SGL: []goroce.SGE{c.mr.SGE(0, checkBufLen)}}); err != nil {
					return err
				}
			}
			c.fill(cmd.K, size+1, true)
		case opRead:
			c.fill(cmd.K, size, false)
		case opFetchAdd, opCmpSwap:
			binary.NativeEndian.PutUint64(c.buf, cmd.A)
		}
		return nil
	}
	switch cmd.Op {
	case opSendImm, opWriteImm:
		wc, err := c.poll(name)
		if err != nil {
			return err
		}
		want := goroce.CompRecv
		if cmd.Op == opWriteImm {
			want = goroce.CompRecvRDMAWithImm
		}
		if wc.Opcode != want || wc.Flags&goroce.WithImm == 0 {
			return fmt.Errorf("%s: receive completion %v flags %#x", name, wc.Opcode, wc.Flags)
		}
		if wc.Imm != uint32(cmd.A) {
			return fmt.Errorf("%s: immediate %#08x, want %#08x", name, wc.Imm, uint32(cmd.A))
		}
		if wc.ByteLen != cmd.Size {
			return fmt.Errorf("%s: byte_len %d, want %d", name, wc.ByteLen, cmd.Size)
		}
		return c.checkData(name, cmd.K, size)
	case opWrite:
		return c.checkData(name, cmd.K, size)
	case opRead:
		for i := range size {
			if c.buf[i] != c.pat(cmd.K, i) {
				return fmt.Errorf("read: served memory changed at byte %d", i)
			}
		}
	case opFetchAdd, opCmpSwap:
		want := cmd.A + cmd.B
		if cmd.Op == opCmpSwap {
			want = cmd.A
			if cmd.A == cmd.B {
				want = cmd.C
			}
		}
		if got := c.mem64(); got != want {
			return fmt.Errorf("%s: memory %#016x, want %#016x", name, got, want)
		}
	}
	return nil
}

// check runs one check as the client: PREP, the work request, VERIFY.
func (c *checkConn) check(cmd checkCmd) error {
	name, size := opNames[cmd.Op], int(cmd.Size)
	exchange := func(phase uint32) error {
		cmd.Phase = phase
		if err := binary.Write(c.tcp, binary.BigEndian, cmd); err != nil {
			return err
		}
		var status uint32
		if err := binary.Read(c.tcp, binary.BigEndian, &status); err != nil {
			return err
		}
		if status != 0 {
			return fmt.Errorf("%s size %d: the server found its memory or completion wrong", name, size)
		}
		return nil
	}
	if err := exchange(phasePrep); err != nil {
		return err
	}
	wr := goroce.SendWR{Flags: goroce.Signaled, SGL: []goroce.SGE{c.mr.SGE(0, size)},
		RemoteAddr: c.peer.Addr, RKey: wire.RKey(c.peer.RKey), Imm: uint32(cmd.A)}
	switch cmd.Op {
	case opSendImm, opWrite, opWriteImm:
		wr.Opcode = map[uint32]goroce.WROpcode{opSendImm: goroce.WRSendImm, opWrite: goroce.WRRDMAWrite, opWriteImm: goroce.WRRDMAWriteImm}[cmd.Op]
		c.fill(cmd.K, size, false)
	case opRead:
		wr.Opcode = goroce.WRRDMARead
		c.fill(cmd.K, size+1, true)
	case opFetchAdd, opCmpSwap:
		wr.Opcode, wr.CompareAdd, wr.Swap = goroce.WRFetchAdd, cmd.B, cmd.C
		if cmd.Op == opCmpSwap {
			wr.Opcode = goroce.WRCompareSwap
		}
		clear(c.buf[:8])
	}
	if err := c.qp.PostSend(&wr); err != nil {
		return fmt.Errorf("%s: post: %w", name, err)
	}
	if _, err := c.poll(name); err != nil {
		return err
	}
	if cmd.Op == opRead {
		if err := c.checkData(name, cmd.K, size); err != nil {
			return err
		}
	}
	if (cmd.Op == opFetchAdd || cmd.Op == opCmpSwap) && c.mem64() != cmd.A {
		return fmt.Errorf("%s: original value %#016x, want %#016x", name, c.mem64(), cmd.A)
	}
	if err := exchange(phaseVerify); err != nil {
		return err
	}
	c.log("client %s size %d: ok", name, size)
	return nil
}

// runClient runs rdmacheck.c's list of checks and returns how many passed.
func (c *checkConn) runClient(maxSize int) (int, error) {
	var cmds []checkCmd
	k := uint32(0)
	for _, size := range []uint32{1, 4096, 65536, 1 << 20} {
		if int(size) > maxSize {
			break
		}
		for op := opSendImm; op <= opRead; op++ {
			cmds = append(cmds, checkCmd{Op: op, Size: size, K: k, A: 0x5eed0000 + uint64(k)})
			k++
		}
	}
	cmds = append(cmds,
		checkCmd{Op: opFetchAdd, Size: 8, K: k, A: 0x01234567fffffff0, B: 0x31},
		checkCmd{Op: opCmpSwap, Size: 8, K: k + 1, A: 0x0a0b0c0d01020304, B: 0x0a0b0c0d01020304, C: 0xfedcba9876543210},
		checkCmd{Op: opCmpSwap, Size: 8, K: k + 2, A: 0x0a0b0c0d01020304, B: 0x0a0b0c0d01020305, C: 0xfedcba9876543210})
	for i, cmd := range cmds {
		if err := c.check(cmd); err != nil {
			return i, err
		}
	}
	return len(cmds), binary.Write(c.tcp, binary.BigEndian, checkCmd{Op: opDone})
}

// runCheckConn runs one connection: as the client of the rdmacheck server at peer (port in its
// address), or as a server on port if peer is empty. It calls ready once its QP is connected and
// returns when that returns, so that connections can be made to run their checks at the same time.
func runCheckConn(dev *goroce.Device, mtu wire.MTU, maxSize int, port int, peer string, log func(string, ...any), ready func()) (n int, err error) {
	defer ready()
	var tcp net.Conn
	if peer != "" {
		addr := net.JoinHostPort(peer, strconv.Itoa(port))
		for i := 0; ; i++ {
			if tcp, err = net.Dial("tcp", addr); err == nil || i == 100 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	} else {
		var l net.Listener
		if l, err = net.Listen("tcp", net.JoinHostPort(lab.HostIP, strconv.Itoa(port))); err == nil {
			log("listening")
			tcp, err = l.Accept()
			l.Close()
		}
	}
	if err != nil {
		return 0, err
	}
	defer tcp.Close()

	pd, err := dev.AllocPD()
	if err != nil {
		return 0, err
	}
	c := &checkConn{tcp: tcp, seed: uint32(port) & 0xff, log: log}
	if c.mr, err = pd.AllocMR(checkBufLen, goroce.LocalWrite|goroce.RemoteWrite|goroce.RemoteRead|goroce.RemoteAtomic); err != nil {
		return 0, err
	}
	c.buf = c.mr.Bytes()
	if c.cq, err = dev.CreateCQ(16); err != nil {
		return 0, err
	}
	c.qp, err = pd.CreateQP(goroce.QPInit{Type: goroce.RC, SendCQ: c.cq, RecvCQ: c.cq, MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1})
	if err != nil {
		return 0, err
	}
	defer c.qp.Close()

	local := c.qp.Endpoint()
	me := checkInfo{QPN: uint32(local.QPN), PSN: uint32(local.PSN), RKey: uint32(c.mr.RKey()), Len: checkBufLen, Addr: c.mr.Addr(), GID: local.GID}
	send := func() error { return binary.Write(tcp, binary.BigEndian, me) }
	recv := func() error { return binary.Read(tcp, binary.BigEndian, &c.peer) }
	if peer != "" {
		err = errors.Join(send(), recv())
	} else {
		err = errors.Join(recv(), send())
	}
	if err != nil {
		return 0, err
	}
	log("%s, path MTU %d: local QPN %#06x PSN %#06x, remote QPN %#06x PSN %#06x rkey %#x addr %#x len %d",
		map[bool]string{true: "client", false: "server"}[peer != ""], mtu.Bytes(), me.QPN, me.PSN, c.peer.QPN, c.peer.PSN, c.peer.RKey, c.peer.Addr, c.peer.Len)
	if peer != "" && c.peer.Len < checkBufLen {
		return 0, fmt.Errorf("server buffer of %d bytes, want %d", c.peer.Len, checkBufLen)
	}
	remote := goroce.Endpoint{QPN: wire.QPN(c.peer.QPN), PSN: wire.PSN(c.peer.PSN), GID: c.peer.GID}
	opts := goroce.DefaultConnectOptions()
	opts.MTU = mtu
	if err := c.qp.Connect(remote, &opts); err != nil {
		return 0, err
	}
	ready()
	// Both sides are in RTS before the first command.
	if _, err := tcp.Write([]byte{'r'}); err != nil {
		return 0, err
	}
	if _, err := tcp.Read(make([]byte, 1)); err != nil {
		return 0, err
	}
	if peer != "" {
		return c.runClient(maxSize)
	}
	return c.serve()
}

// rdmacheckPeerMain is the goroce peer's main: flags -m (path MTU), -z (largest message) and -addr
// (the device's address, lab.HostIP unless set: an IPv6 one, with its zone if link-local), then one
// argument per connection, "client:PORT:IP" or "server:PORT". It prints rdmacheck's lines, prefixed
// with the port, and exits non-zero if any connection fails. The connections start their checks
// together, once all of them are connected (or have failed).
func rdmacheckPeerMain(args []string) int {
	fs := flag.NewFlagSet("rdmacheck-peer", flag.ContinueOnError)
	mtuBytes := fs.Int("m", 1024, "path MTU")
	maxSize := fs.Int("z", 1<<20, "largest message")
	addrFlag := fs.String("addr", lab.HostIP, "the goroce device's address")
	if fs.Parse(args) != nil {
		return 1
	}
	addr, err := netip.ParseAddr(*addrFlag)
	if err != nil {
		fmt.Println("rdmacheck:", err)
		return 1
	}
	mtu, ok := wire.MTUFromBytes(*mtuBytes)
	if !ok {
		fmt.Println("rdmacheck: bad MTU")
		return 1
	}
	dev, err := goroce.Open(goroce.Config{Addr: addr, Port: goroce.DefaultPort})
	if err != nil {
		fmt.Println("rdmacheck:", err)
		return 1
	}
	defer dev.Close()
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed bool
		ready  sync.WaitGroup // connections not yet connected
	)
	ready.Add(fs.NArg())
	for _, spec := range fs.Args() {
		role, rest, _ := strings.Cut(spec, ":")
		portStr, peer, _ := strings.Cut(rest, ":")
		port, err := strconv.Atoi(portStr)
		if err != nil || (role == "client") != (peer != "") || (role != "client" && role != "server") {
			fmt.Printf("rdmacheck: bad connection %q\n", spec)
			return 1
		}
		log := func(format string, args ...any) {
			mu.Lock()
			defer mu.Unlock()
			fmt.Printf("rdmacheck[%d]: %s\n", port, fmt.Sprintf(format, args...))
		}
		connected := sync.OnceFunc(ready.Done)
		wg.Go(func() {
			n, err := runCheckConn(dev, mtu, *maxSize, port, peer, log, func() { connected(); ready.Wait() })
			if err != nil {
				log("FAIL: %v", err)
				mu.Lock()
				failed = true
				mu.Unlock()
				return
			}
			log("%d checks passed", n)
		})
	}
	wg.Wait()
	if failed {
		return 2
	}
	return 0
}
