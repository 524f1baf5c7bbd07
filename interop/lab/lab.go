//go:build linux

// Package lab is goroce's interop harness: it builds a Debian guest image with Linux soft-RoCE (rxe),
// boots guests under qemu inside a network namespace of its own, and runs commands in them.
//
// The namespace (Namespace) holds a bridge with the host-side address HostIP (10.77.0.1/24), where a
// goroce peer runs (`ip netns exec`), and one tap per guest; guest N has eth0 = 10.77.0.(10+N) with the
// rxe device rxe0 on it. Nothing outside the namespace is ever addressed.
//
// The image is built from Debian packages (debootstrap, then an initramfs that holds the whole trimmed
// root file system) into Dir, by default /var/tmp/goroce-interop, and rebuilt only when its inputs
// (suite, package list, modules, the guest's init and build script) change. Everything needs root.
package lab

import (
	"bytes"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

//go:embed assets/init assets/cmd assets/build.sh
var assets embed.FS

// The namespace and its addresses. The subnet is private to the namespace.
const (
	Namespace = "goroce-rxe"
	Bridge    = "grxbr0"
	HostIP    = "10.77.0.1"
	// HostIP6 is the host side's IPv6 address; guests have fd77::(10+N) besides their link-local ones.
	HostIP6 = "fd77::1"
	// GuestCmdPort is the TCP port of the guests' command channel.
	GuestCmdPort = 7777
)

// The guest image's inputs.
const (
	Suite = "bookworm"
	// Packages are installed into the guest by debootstrap.
	Packages = "linux-image-amd64,kmod,iproute2,rdma-core,ibverbs-providers,ibverbs-utils,perftest,rdmacm-utils,tcpdump,busybox,procps,socat"
	// Modules are copied into the initramfs with their dependencies; the guest's init loads them.
	Modules = "virtio_pci virtio_net crc32_generic crc32_pclmul ib_uverbs rdma_ucm rdma_rxe ib_umad sch_netem ifb sch_ingress act_mirred cls_matchall"
)

// HostTools are the host commands the lab needs, with the Debian packages that provide them.
var HostTools = map[string]string{
	"qemu-system-x86_64": "qemu-system-x86",
	"debootstrap":        "debootstrap",
	"cpio":               "cpio",
	"ip":                 "iproute2",
	"gzip":               "gzip",
	"tar":                "tar",
}

// GuestIP returns guest n's address.
func GuestIP(n int) netip.Addr { return netip.AddrFrom4([4]byte{10, 77, 0, byte(10 + n)}) }

// GuestIP6 returns guest n's IPv6 address, fd77::(10+N) with the number written in decimal digits,
// as the guest's init assigns it.
func GuestIP6(n int) netip.Addr { return netip.MustParseAddr(fmt.Sprintf("fd77::%d", 10+n)) }

// Lab is one namespace and the guests in it, described by directories and pid files so that separate
// processes (the labctl command, a test binary) see the same lab.
type Lab struct {
	// Dir holds the image (vmlinuz, initrd.gz, rootfs/) and run/ (pid files, consoles).
	Dir string
	// Mirror is the Debian archive debootstrap uses.
	Mirror string
	// MemMiB is each guest's memory.
	MemMiB int
	// MTU is the link MTU of the bridge, the taps and the guests' eth0. 9000 lets rxe use path MTU 4096.
	MTU int
	// BootTimeout bounds a guest's boot.
	BootTimeout time.Duration
	// AccelMode chooses the accelerator: "kvm", "tcg", or "auto" (and "") for KVM where a probe guest
	// runs under it and TCG otherwise. See Accel.
	AccelMode string
	// QEMU is the qemu system emulator to run.
	QEMU string
	// KVMDevice is the KVM device whose absence means TCG.
	KVMDevice string
	// ProbeTimeout bounds the KVM probe; a probe that takes longer means TCG.
	ProbeTimeout time.Duration
	// AptGet is the apt-get command InstallTools runs; AptLockTimeout bounds how long it waits for
	// another package manager to release dpkg's and apt's locks.
	AptGet         string
	AptLockTimeout time.Duration
	// Log receives progress lines; nil discards them.
	Log io.Writer

	// netns is the network namespace, Namespace unless a test chose another; aptRetry is the pause
	// between apt runs while a lock is held, aptLockRetry unless a test chose another.
	netns    string
	aptRetry time.Duration

	accelMu sync.Mutex
	accel   *AccelChoice // decided on first use
}

// New returns the lab configured from the environment: GOROCE_INTEROP_DIR (default
// /var/tmp/goroce-interop), GOROCE_INTEROP_MIRROR (default: the Debian archive this machine's apt uses),
// GOROCE_INTEROP_MEM (MiB, default 1024), GOROCE_INTEROP_ACCEL (kvm, tcg or auto; see AccelEnv) and
// GOROCE_INTEROP_QEMU (default qemu-system-x86_64).
func New() *Lab {
	l := &Lab{
		Dir: "/var/tmp/goroce-interop", MemMiB: 1024, MTU: 9000, BootTimeout: 5 * time.Minute,
		AccelMode: os.Getenv(AccelEnv), QEMU: "qemu-system-x86_64", KVMDevice: "/dev/kvm",
		ProbeTimeout: 20 * time.Second, AptGet: "apt-get", AptLockTimeout: 10 * time.Minute,
	}
	if d := os.Getenv("GOROCE_INTEROP_DIR"); d != "" {
		l.Dir = d
	}
	if q := os.Getenv("GOROCE_INTEROP_QEMU"); q != "" {
		l.QEMU = q
	}
	l.Mirror = os.Getenv("GOROCE_INTEROP_MIRROR")
	if l.Mirror == "" {
		l.Mirror = aptMirror()
	}
	if m, err := strconv.Atoi(os.Getenv("GOROCE_INTEROP_MEM")); err == nil && m > 0 {
		l.MemMiB = m
	}
	return l
}

func (l *Lab) logf(format string, args ...any) {
	if l.Log != nil {
		fmt.Fprintf(l.Log, "lab: "+format+"\n", args...)
	}
}

func (l *Lab) run() string { return filepath.Join(l.Dir, "run") }

// namespace returns the lab's network namespace.
func (l *Lab) namespace() string {
	if l.netns != "" {
		return l.netns
	}
	return Namespace
}

// aptMirror returns the first Debian archive in this machine's apt sources that is not the security
// archive, so the image comes from where the machine already gets its packages.
func aptMirror() string {
	var files []string
	for _, pat := range []string{"/etc/apt/sources.list.d/*.sources", "/etc/apt/sources.list", "/etc/apt/sources.list.d/*.list"} {
		m, _ := filepath.Glob(pat)
		files = append(files, m...)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			fields := strings.Fields(line)
			var uri string
			switch {
			case len(fields) >= 2 && fields[0] == "URIs:":
				uri = fields[1]
			case len(fields) >= 3 && fields[0] == "deb":
				uri = fields[1]
				if strings.HasPrefix(uri, "[") {
					uri = fields[2]
				}
			}
			if uri != "" && strings.Contains(uri, "debian") && !strings.Contains(uri, "security") {
				return uri
			}
		}
	}
	return "http://deb.debian.org/debian"
}

// MissingTools returns the host commands the lab needs that are not installed.
func MissingTools() []string {
	var miss []string
	for t := range HostTools {
		if _, err := exec.LookPath(t); err != nil {
			miss = append(miss, t)
		}
	}
	return miss
}

// InstallTools installs the missing host tools with apt-get.
func (l *Lab) InstallTools(ctx context.Context) error {
	miss := MissingTools()
	if len(miss) == 0 {
		return nil
	}
	pkgs := []string{"install", "-y", "--no-install-recommends"}
	for _, t := range miss {
		pkgs = append(pkgs, HostTools[t])
	}
	l.logf("installing %v", pkgs[3:])
	if err := l.apt(ctx, "update"); err != nil {
		return err
	}
	return l.apt(ctx, pkgs...)
}

func (l *Lab) cmd(ctx context.Context, name string, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, name, args...)
	w := l.Log
	if w == nil {
		w = io.Discard
	}
	c.Stdout, c.Stderr = w, w
	return c
}

func hashOf(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s;", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Build builds the guest image unless a build from the same inputs is already in Dir.
func (l *Lab) Build(ctx context.Context) error {
	if miss := MissingTools(); len(miss) > 0 {
		return fmt.Errorf("missing host tools %v (install: apt-get install qemu-system-x86 debootstrap cpio iproute2)", miss)
	}
	adir := filepath.Join(l.Dir, "assets")
	if err := os.MkdirAll(adir, 0o755); err != nil {
		return err
	}
	var files []string
	err := fs.WalkDir(assets, "assets", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := assets.ReadFile(p)
		if err != nil {
			return err
		}
		files = append(files, p, string(b))
		return os.WriteFile(filepath.Join(adir, filepath.Base(p)), b, 0o755)
	})
	if err != nil {
		return err
	}
	rootKey := hashOf(Suite, Packages)
	imageKey := hashOf(append([]string{rootKey, Modules}, files...)...)
	c := l.cmd(ctx, "bash", filepath.Join(adir, "build.sh"))
	c.Env = append(os.Environ(), "DIR="+l.Dir, "SUITE="+Suite, "MIRROR="+l.Mirror, "PKGS="+Packages,
		"MODS="+Modules, "ROOTFS_KEY="+rootKey, "IMAGE_KEY="+imageKey, "ASSETS="+adir)
	if err := c.Run(); err != nil {
		return fmt.Errorf("building the guest image: %w", err)
	}
	return nil
}

// KernelVersion returns the guest kernel's release, as the build recorded it.
func (l *Lab) KernelVersion() string {
	b, _ := os.ReadFile(filepath.Join(l.Dir, "kernel-version"))
	return strings.TrimSpace(string(b))
}

// ip runs ip(8) with args and returns its combined output.
func ip(ctx context.Context, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// nsExists reports whether the lab's namespace exists.
func (l *Lab) nsExists() bool {
	_, err := os.Stat("/run/netns/" + l.namespace())
	return err == nil
}

// NamespaceUp creates the namespace and its bridge unless they exist.
func (l *Lab) NamespaceUp(ctx context.Context) error {
	ns := l.namespace()
	if !l.nsExists() {
		if _, err := ip(ctx, "netns", "add", ns); err != nil {
			return err
		}
	}
	steps := [][]string{{"-n", ns, "link", "set", "lo", "up"}}
	if _, err := ip(ctx, "-n", ns, "link", "show", Bridge); err != nil {
		steps = append(steps,
			[]string{"-n", ns, "link", "add", Bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0"},
			[]string{"-n", ns, "addr", "add", HostIP + "/24", "dev", Bridge})
	}
	steps = append(steps, []string{"-n", ns, "link", "set", Bridge, "mtu", strconv.Itoa(l.MTU), "up"})
	for _, s := range steps {
		if _, err := ip(ctx, s...); err != nil {
			return err
		}
	}
	// Replies from the guests come back on the bridge. IPv6 is on: HostIP6 and the bridge's link-local
	// address, both without duplicate address detection, so they are usable at once.
	_ = exec.CommandContext(ctx, "ip", "netns", "exec", ns, "sysctl", "-qw",
		"net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0",
		"net.ipv6.conf.all.disable_ipv6=0", "net.ipv6.conf.default.disable_ipv6=0",
		"net.ipv6.conf."+Bridge+".disable_ipv6=0", "net.ipv6.conf.all.accept_dad=0",
		"net.ipv6.conf."+Bridge+".accept_dad=0").Run()
	if out, err := ip(ctx, "-n", ns, "-6", "addr", "show", "dev", Bridge); err == nil && !strings.Contains(out, HostIP6+"/") {
		if _, err := ip(ctx, "-n", ns, "-6", "addr", "add", HostIP6+"/64", "dev", Bridge, "nodad"); err != nil {
			return err
		}
	}
	return nil
}

// LinkLocal returns the bridge's IPv6 link-local address in the namespace, with its zone (the bridge's
// name), for tests of link-local GIDs.
func (l *Lab) LinkLocal(ctx context.Context) (netip.Addr, error) {
	out, err := ip(ctx, "-n", l.namespace(), "-6", "-o", "addr", "show", "dev", Bridge, "scope", "link")
	if err != nil {
		return netip.Addr{}, err
	}
	for _, f := range strings.Fields(out) {
		if p, err := netip.ParsePrefix(f); err == nil && p.Addr().IsLinkLocalUnicast() {
			return p.Addr().WithZone(Bridge), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("lab: no link-local address on %s: %s", Bridge, out)
}

// Guest is one booted guest.
type Guest struct {
	N   int
	IP  netip.Addr
	lab *Lab
}

// Guest returns guest n (booted or not).
func (l *Lab) Guest(n int) *Guest { return &Guest{N: n, IP: GuestIP(n), lab: l} }

func (l *Lab) pidFile(n int) string { return filepath.Join(l.run(), fmt.Sprintf("vm%d.pid", n)) }
func (l *Lab) console(n int) string { return filepath.Join(l.run(), fmt.Sprintf("vm%d.console", n)) }
func (l *Lab) monitor(n int) string { return filepath.Join(l.run(), fmt.Sprintf("vm%d.mon", n)) }
func tapName(n int) string          { return fmt.Sprintf("grxtap%d", n) }
func readPID(path string) (int, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid, err == nil && pid > 0
}

// running returns guest n's qemu pid if it runs. A pid file alone proves nothing: qemu writes it
// before it can fail, and the pid may since have become a zombie nobody reaps or another process. So
// the process must be alive and be the qemu started with this guest's pid file.
func (l *Lab) running(n int) (int, bool) {
	pid, ok := l.readQEMUPID(n)
	if !ok || syscall.Kill(pid, 0) != nil {
		return 0, false
	}
	if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		// The state follows the parenthesised command name.
		if i := bytes.LastIndexByte(st, ')'); i >= 0 && i+2 < len(st) && st[i+2] == 'Z' {
			return 0, false
		}
	}
	if !hasArgs(qemuCmdline(pid), "-pidfile", l.pidFile(n)) {
		return 0, false
	}
	return pid, true
}

// qemuCmdline returns process pid's arguments.
func qemuCmdline(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// hasArgs reports whether args holds name immediately followed by value.
func hasArgs(args []string, name, value string) bool {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == name && args[i+1] == value {
			return true
		}
	}
	return false
}

// accelOf returns the accelerator of a running qemu, from its arguments.
func accelOf(pid int) Accel {
	for _, a := range qemuCmdline(pid) {
		if a == "kvm" || strings.HasPrefix(a, "kvm,") {
			return KVM
		}
	}
	return TCG
}

func (l *Lab) readQEMUPID(n int) (int, bool) { return readPID(l.pidFile(n)) }

// Console returns guest n's serial console log.
func (l *Lab) Console(n int) string {
	b, _ := os.ReadFile(l.console(n))
	return string(b)
}

// Up builds the image if needed, creates the namespace and boots the guests (default: guest 1) one
// after the other. A guest that already runs is left alone.
func (l *Lab) Up(ctx context.Context, ids ...int) ([]*Guest, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("the lab needs root (network namespaces, taps)")
	}
	if err := l.Build(ctx); err != nil {
		return nil, err
	}
	return l.boot(ctx, ids...)
}

// boot creates the namespace and starts the guests (default: guest 1) that do not run yet, one after
// the other, from the image as it is.
func (l *Lab) boot(ctx context.Context, ids ...int) ([]*Guest, error) {
	if err := os.MkdirAll(l.run(), 0o755); err != nil {
		return nil, err
	}
	if err := l.NamespaceUp(ctx); err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		ids = []int{1}
	}
	var gs []*Guest
	for _, n := range ids {
		g, err := l.bootOne(ctx, n)
		if err != nil {
			return gs, err
		}
		gs = append(gs, g)
	}
	return gs, nil
}

// bootOne starts guest n unless it runs. Under an automatically chosen KVM, a guest that fails to
// start moves the lab to TCG and starts again under it.
func (l *Lab) bootOne(ctx context.Context, n int) (*Guest, error) {
	if n < 1 || n > 200 {
		return nil, fmt.Errorf("guest number %d out of 1..200", n)
	}
	g := l.Guest(n)
	if _, ok := l.running(n); ok {
		l.logf("vm%d already running", n)
		return g, nil
	}
	choice, err := l.Accel(ctx)
	if err != nil {
		return nil, err
	}
	err = l.start(ctx, g, choice.Accel)
	if err != nil && choice.Accel == KVM && !choice.Forced && ctx.Err() == nil {
		l.logf("vm%d failed under KVM: %v", n, err)
		l.fallBackToTCG(firstLines(err.Error(), 2))
		err = l.start(ctx, g, TCG)
	}
	if err != nil {
		return nil, err
	}
	return g, nil
}

// start boots guest g under accel and waits until its command channel answers. Whatever it fails at,
// it leaves nothing behind: no qemu, no pid file, no tap.
func (l *Lab) start(ctx context.Context, g *Guest, accel Accel) error {
	n, ns, tap := g.N, l.namespace(), tapName(g.N)
	l.clear(ctx, n) // a guest that is not running may have left its pid file, tap or monitor
	for _, s := range [][]string{
		{"-n", ns, "tuntap", "add", tap, "mode", "tap"},
		{"-n", ns, "link", "set", tap, "mtu", strconv.Itoa(l.MTU)},
		{"-n", ns, "link", "set", tap, "master", Bridge, "up"},
	} {
		if _, err := ip(ctx, s...); err != nil {
			l.clear(ctx, n)
			return err
		}
	}
	if err := os.WriteFile(l.console(n), nil, 0o644); err != nil {
		l.clear(ctx, n)
		return err
	}
	args := append([]string{"netns", "exec", ns, l.QEMU}, accel.qemuArgs()...)
	args = append(args, "-m", strconv.Itoa(l.MemMiB), "-smp", "1",
		"-kernel", filepath.Join(l.Dir, "vmlinuz"), "-initrd", filepath.Join(l.Dir, "initrd.gz"),
		"-append", fmt.Sprintf("console=ttyS0 goroce_id=%d goroce_mtu=%d panic=-1 quiet loglevel=5 sysrq_always_enabled", n, l.MTU),
		"-display", "none", "-monitor", "unix:"+l.monitor(n)+",server,nowait", "-serial", "file:"+l.console(n),
		"-no-reboot", "-netdev", fmt.Sprintf("tap,id=n0,ifname=%s,script=no,downscript=no", tap),
		"-device", fmt.Sprintf("virtio-net-pci,netdev=n0,mac=52:54:00:77:00:%02x", 10+n),
		"-daemonize", "-pidfile", l.pidFile(n))
	t0 := time.Now()
	if out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput(); err != nil {
		l.stop(ctx, n)
		return fmt.Errorf("qemu for vm%d under %s: %v: %s", n, accel, err, bytes.TrimSpace(out))
	}
	deadline := t0.Add(l.BootTimeout)
	for {
		if strings.Contains(l.Console(n), "GOROCE-GUEST-READY") {
			cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			_, err := g.Exec(cctx, "true")
			cancel()
			if err == nil {
				break
			}
		}
		_, alive := l.running(n)
		if !alive || time.Now().After(deadline) || ctx.Err() != nil {
			why := "did not boot in " + l.BootTimeout.String()
			switch {
			case ctx.Err() != nil:
				why = "did not boot: " + ctx.Err().Error()
			case !alive:
				why = "qemu exited during boot"
			}
			console := tail(l.Console(n), 20)
			l.stop(context.Background(), n)
			return fmt.Errorf("vm%d under %s %s; console:\n%s", n, accel, why, console)
		}
		time.Sleep(300 * time.Millisecond)
	}
	l.logf("vm%d up at %v in %.1fs (%s)", n, g.IP, time.Since(t0).Seconds(), accel)
	return nil
}

func tail(s string, lines int) string {
	ls := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(ls) > lines {
		ls = ls[len(ls)-lines:]
	}
	return strings.Join(ls, "\n")
}

// Down stops the given guests; with none it stops every guest and deletes the namespace.
func (l *Lab) Down(ctx context.Context, ids ...int) error {
	all := len(ids) == 0
	if all {
		ids = l.Guests()
	}
	for _, n := range ids {
		l.stop(ctx, n)
		l.logf("vm%d down", n)
	}
	if all && l.nsExists() {
		if _, err := ip(ctx, "netns", "del", l.namespace()); err != nil {
			return err
		}
		l.logf("namespace %s removed", l.namespace())
	}
	return nil
}

// stop ends guest n's qemu if it runs (SIGTERM, then SIGKILL after 5 s) and clears its state.
func (l *Lab) stop(ctx context.Context, n int) {
	if pid, ok := l.running(n); ok {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		for i := 0; i < 50 && syscall.Kill(pid, 0) == nil; i++ {
			time.Sleep(100 * time.Millisecond)
		}
		if _, ok := l.running(n); ok {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	l.clear(ctx, n)
}

// clear removes what a guest that no longer runs left behind: its pid file, monitor socket and tap.
func (l *Lab) clear(ctx context.Context, n int) {
	_ = os.Remove(l.pidFile(n))
	_ = os.Remove(l.monitor(n))
	if l.nsExists() {
		_, _ = ip(ctx, "-n", l.namespace(), "link", "del", tapName(n))
	}
}

// Guests returns the numbers of the guests that have a pid file.
func (l *Lab) Guests() []int {
	m, _ := filepath.Glob(filepath.Join(l.run(), "vm*.pid"))
	var ids []int
	for _, p := range m {
		s := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(p), "vm"), ".pid")
		if n, err := strconv.Atoi(s); err == nil {
			ids = append(ids, n)
		}
	}
	return ids
}

// Status returns one line per guest with a pid file.
func (l *Lab) Status() []string {
	var out []string
	for _, n := range l.Guests() {
		if pid, ok := l.running(n); ok {
			out = append(out, fmt.Sprintf("vm%d %v pid %d running under %s", n, GuestIP(n), pid, accelOf(pid)))
		} else {
			out = append(out, fmt.Sprintf("vm%d stale pid file", n))
		}
	}
	return out
}

// NSCommand returns a command that runs name with args inside the namespace, where HostIP is local.
func NSCommand(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", Namespace, name}, args...)...)
}
