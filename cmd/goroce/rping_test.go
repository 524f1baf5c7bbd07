package main

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/goroce/goroce/internal/syncbuf"
	"github.com/goroce/goroce/interop/rping"
)

// TestRpingFlags: rping's flags, run together or apart, reach package rping's options; what rping
// refuses is refused with its usage or a one-line error.
func TestRpingFlags(t *testing.T) {
	def := rping.DefaultOptions()
	with := func(f func(*rping.Options)) rping.Options { o := def; f(&o); return o }
	for _, c := range []struct {
		args []string
		want rpingArgs
	}{
		{[]string{"-s", "-a", "10.0.0.1"}, rpingArgs{server: true, addr: "10.0.0.1", port: 7174, opts: def}},
		{[]string{"-c", "-vVd", "-a", "10.0.0.1", "-p", "9999", "-C", "10", "-S", "1000", "-I", "10.0.0.2"},
			rpingArgs{addr: "10.0.0.1", source: "10.0.0.2", port: 9999, opts: with(func(o *rping.Options) {
				o.Verbose, o.Check, o.Debug, o.Count, o.Size = true, true, true, 10, 1000
			})}},
		{[]string{"-sP", "-q", "-a", "::1", "-timeout", "5s"}, rpingArgs{server: true, addr: "::1", port: 7174, timeout: 5 * time.Second,
			opts: with(func(o *rping.Options) { o.Persistent = true })}},
	} {
		a, err := parseRping(c.args)
		if err != nil || a != c.want {
			t.Errorf("%q: %+v, %v; want %+v", c.args, a, err, c.want)
		}
	}
	for _, bad := range [][]string{{}, {"-s", "-c", "-a", "x"}, {"-x"}, {"-C"}} {
		if _, err := parseRping(bad); !errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want the usage", bad, err)
		}
	}
	for _, bad := range [][]string{{"-s"}, {"-c"}, {"-c", "-a", "h", "-S", "25"}, {"-c", "-a", "h", "-S", "65536"},
		{"-c", "-a", "h", "-C", "-1"}, {"-c", "-a", "h", "-P"}, {"-s", "-a", "h", "-I", "x"}, {"-c", "-a", "h", "-p", "0"},
		{"-c", "-a", "h", "extra"}} {
		if _, err := parseRping(bad); err == nil || errors.Is(err, errUsage) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: %v, want a one-line error", bad, err)
		}
	}
}

// TestRpingCommand: goroce rping -s and -c over the host's loopback sockets, -v -V: the client prints
// every ping's data, the server the same and the client's disconnection, both exit without error.
func TestRpingCommand(t *testing.T) {
	var sout, serr syncbuf.Buffer
	done := make(chan error, 1)
	go func() {
		done <- rpingMain([]string{"-s", "-vVd", "-a", "127.0.75.2", "-p", "7200", "-S", "100", "-timeout", "20s"}, &sout, &serr)
	}()
	for !strings.Contains(sout.String(), "rdma_listen") {
		select {
		case err := <-done:
			t.Fatalf("server ended: %v\n%s", err, serr.String())
		case <-time.After(5 * time.Millisecond):
		}
	}
	var cout, cerr bytes.Buffer
	capFile := filepath.Join(t.TempDir(), "rping.pcapng")
	if err := rpingMain([]string{"-c", "-v", "-V", "-a", "127.0.75.2", "-I", "127.0.75.1", "-p", "7200", "-C", "3", "-S", "100", "-timeout", "20s",
		"-w", capFile}, &cout, &cerr); err != nil {
		t.Fatalf("client: %v\n%s", err, cerr.String())
	}
	if err := <-done; err != nil {
		t.Fatalf("server: %v\n%s", err, serr.String())
	}
	if n := strings.Count(cout.String(), "ping data: rdma-ping-"); n != 3 {
		t.Errorf("client output:\n%s", cout.String())
	}
	if n := strings.Count(sout.String(), "server ping data: rdma-ping-"); n != 3 || serr.String() != "server DISCONNECT EVENT...\n" {
		t.Errorf("server output:\n%s\nstderr:\n%s", sout.String(), serr.String())
	}

	// -w: the client's capture holds the CM's exchange and the pings, every ICRC verified, and dump
	// -explain tells the connection's story.
	if !strings.Contains(cerr.String(), "wrote ") {
		t.Errorf("the client does not say it wrote its capture:\n%s", cerr.String())
	}
	var dumped bytes.Buffer
	total, ok := dump(&dumped, dumpOptions{explain: true}, capFile)
	if !ok || total.roce == 0 || total.icrcOK != total.roce {
		t.Fatalf("dump: %s\n%s", total.line(), lastLines(dumped.String(), 5))
	}
	for _, want := range []string{"REQ", "REP", "RTU", "DREQ", "DREP", "RDMA Read Request"} {
		if !strings.Contains(dumped.String(), want) {
			t.Errorf("goroce dump -explain of the capture says nothing of %s:\n%s", want, lastLines(dumped.String(), 40))
		}
	}
}
