package perf

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
)

// server is the child's side of one running measurement.
type server interface {
	// mark snapshots the counters at the start of the timed interval.
	mark()
	// stop ends the measurement, frees what it holds and reports; it returns within a bounded time.
	stop() PeerReport
}

// Serve is the child: it says hello on w, then answers the requests it reads from r, one JSON
// object a line, until r ends (the parent closed the pipe, or exited); then it stops whatever
// measurement runs and returns. It returns nil at the end of r, and an error if r or w failed.
func Serve(r io.Reader, w io.Writer) error {
	enc := json.NewEncoder(w) // one object a line
	if err := enc.Encode(reply{Op: opHello, Version: protoVersion, PID: os.Getpid()}); err != nil {
		return fmt.Errorf("perf child: hello: %w", err)
	}
	var cur serving
	defer func() {
		if cur.srv != nil {
			cur.srv.stop()
		}
	}()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	for sc.Scan() {
		rep := handle(&cur, sc.Bytes())
		if err := enc.Encode(rep); err != nil {
			return fmt.Errorf("perf child: reply to %s: %w", rep.Op, err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("perf child: read requests: %w", err)
	}
	return nil
}

// serving is the measurement the child runs, if any, and its CPU time from its mark (none without).
type serving struct {
	srv server
	cpu cpuSpan
}

// handle answers one request; cur is the measurement running, if any.
func handle(cur *serving, line []byte) reply {
	var req request
	if err := json.Unmarshal(bytes.TrimSpace(line), &req); err != nil {
		return reply{Op: "?", Err: fmt.Sprintf("undecodable request %q: %v", truncate(string(line), 200), err)}
	}
	rep := reply{Op: req.Op}
	switch req.Op {
	case opStart:
		if cur.srv != nil {
			rep.Err = "a measurement is already running"
			break
		}
		srv, ep, err := startServer(req)
		if err != nil {
			rep.Err = err.Error()
			break
		}
		*cur, rep.Endpoint = serving{srv: srv}, &ep
	case opMark:
		if cur.srv == nil {
			rep.Err = "no measurement is running"
			break
		}
		cur.srv.mark()
		cur.cpu.begin()
	case opStop:
		if cur.srv == nil {
			rep.Err = "no measurement is running"
			break
		}
		cur.cpu.end() // before stop, which tears the measurement down
		r := cur.srv.stop()
		r.CPU = cur.cpu.used()
		*cur, rep.Report = serving{}, &r
	default:
		rep.Err = fmt.Sprintf("unknown operation %q", req.Op)
	}
	return rep
}

// startServer sets up the child's side of the measurement req starts.
func startServer(req request) (server, Endpoint, error) {
	if req.Spec == nil {
		return nil, Endpoint{}, errors.New("start without a spec")
	}
	s := *req.Spec
	addr, err := netip.ParseAddr(req.Addr)
	if err != nil {
		return nil, Endpoint{}, fmt.Errorf("start %s: address: %w", s.Kind, err)
	}
	var srv server
	var ep Endpoint
	switch s.Kind {
	case GoroceWrite, GoroceRead, GoroceSend, GorocePingPong:
		srv, ep, err = startGoroceServer(s, addr, req.Peer)
	case TCPStream:
		srv, ep, err = startTCPServer(s, addr)
	case UDPStream, UDPPingPong:
		srv, ep, err = startUDPServer(s, addr)
	default:
		return nil, Endpoint{}, fmt.Errorf("start: %q is not a two-process measurement", s.Kind)
	}
	if err != nil {
		return nil, Endpoint{}, fmt.Errorf("start %s: %w", s.Kind, err)
	}
	return srv, ep, nil
}
