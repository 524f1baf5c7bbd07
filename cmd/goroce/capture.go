package main

import (
	"fmt"
	"io"

	"github.com/goroce/goroce"
	"github.com/goroce/goroce/interop/capture"
)

// captureRun opens file, the pcapng file a command's flag (pingpong's and rping's -w, perf's -pcap)
// names, and returns the goroce.Tracer that writes the run's packets to it and the func that ends the
// file. Defer that func before the run's devices open, so that it runs after they have closed and
// every packet is in: it closes the file and tells stderr how many packets it holds.
func captureRun(cmd, flag, file string, stderr io.Writer) (goroce.Tracer, func(), error) {
	cw, err := capture.Create(file, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("-%s: %w", flag, err)
	}
	done := func() {
		if err := cw.Close(); err != nil {
			fmt.Fprintf(stderr, "goroce %s: -%s %s: %v\n", cmd, flag, file, err)
			return
		}
		fmt.Fprintf(stderr, "wrote %d packets to %s\n", cw.Packets(), file)
	}
	return cw.Tracer(nil), done, nil
}
