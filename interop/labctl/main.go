//go:build linux

// Command labctl drives goroce's interop lab by hand: Debian guests with Linux soft-RoCE (rxe) under
// qemu, in the network namespace goroce-rxe (bridge 10.77.0.1/24, guest N = 10.77.0.(10+N)).
//
//	go run ./interop/labctl build            build the guest image (cached; rebuilt when inputs change)
//	go run ./interop/labctl up 1 2           boot guests 1 and 2
//	go run ./interop/labctl exec 1 ibv_devinfo -d rxe0
//	go run ./interop/labctl exec -i 1 'cat > /tmp/f' < f
//	go run ./interop/labctl ns CMD...        run a host command inside the namespace
//	go run ./interop/labctl status | console N | kernel
//	go run ./interop/labctl accel            which accelerator guests would boot under, and why
//	go run ./interop/labctl down [N...]      stop guests; with no N also delete the namespace
//
// It needs root. GOROCE_INTEROP_DIR, GOROCE_INTEROP_MIRROR and GOROCE_INTEROP_MEM configure the lab;
// GOROCE_INTEROP_ACCEL=kvm|tcg|auto chooses the accelerator (auto: KVM where a probe guest boots under
// it, TCG otherwise).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"

	"github.com/goroce/goroce/interop/lab"
)

func usage() {
	fmt.Fprintln(os.Stderr, "usage: labctl build | up [N...] | exec [-i] N CMD... | ns CMD... | status | console N | kernel | accel | down [N...]")
	os.Exit(2)
}

func ids(args []string) []int {
	var out []int
	for _, a := range args {
		n, err := strconv.Atoi(a)
		if err != nil {
			usage()
		}
		out = append(out, n)
	}
	return out
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	l := lab.New()
	l.Log = os.Stderr
	args := os.Args[2:]
	var err error
	switch os.Args[1] {
	case "build":
		if err = l.InstallTools(ctx); err == nil {
			err = l.Build(ctx)
		}
		if err == nil {
			fmt.Println("guest kernel", l.KernelVersion())
		}
	case "up":
		if err = l.InstallTools(ctx); err == nil {
			_, err = l.Up(ctx, ids(args)...)
		}
	case "down":
		err = l.Down(ctx, ids(args)...)
	case "status":
		for _, s := range l.Status() {
			fmt.Println(s)
		}
	case "kernel":
		fmt.Println(l.KernelVersion())
	case "accel":
		var c lab.AccelChoice
		if err = l.InstallTools(ctx); err == nil {
			err = l.Build(ctx)
		}
		if err == nil {
			c, err = l.Accel(ctx)
		}
		if err == nil {
			fmt.Println(c)
		}
	case "console":
		if len(args) != 1 {
			usage()
		}
		fmt.Print(l.Console(ids(args)[0]))
	case "exec":
		stdin := false
		if len(args) > 0 && args[0] == "-i" {
			stdin, args = true, args[1:]
		}
		if len(args) < 2 {
			usage()
		}
		g := l.Guest(ids(args[:1])[0])
		var in *os.File
		if stdin {
			in = os.Stdin
		}
		if in != nil {
			err = g.ExecIO(ctx, strings.Join(args[1:], " "), in, os.Stdout)
		} else {
			err = g.ExecIO(ctx, strings.Join(args[1:], " "), nil, os.Stdout)
		}
		var ee *lab.ExitError
		if errors.As(err, &ee) {
			os.Exit(ee.Status)
		}
	case "ns":
		if len(args) < 1 {
			usage()
		}
		c := lab.NSCommand(ctx, args[0], args[1:]...)
		c.Stdin, c.Stdout, c.Stderr = os.Stdin, os.Stdout, os.Stderr
		err = c.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			os.Exit(ee.ExitCode())
		}
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "labctl:", err)
		os.Exit(1)
	}
}
