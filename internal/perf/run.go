package perf

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
)

// maxChildRestarts bounds how many times Run replaces a child that broke (died, or stopped
// answering) before it gives up.
const maxChildRestarts = 2

// Outcome is one run of one measurement.
type Outcome struct {
	Result Result
	Err    error
	Done   bool // false: the run did not get to it
}

// Report is what Run measured.
type Report struct {
	Config   Config
	Specs    []Spec
	Outcomes map[string][]Outcome // by Spec.ID, one per run
	Idle     *IdleResult          // nil if not run
	IdleErr  error
	// ChildPIDs are the child processes the runs used, more than one if one broke.
	ChildPIDs []int
}

// Figures returns the figure m of measurement id in each run, NaN where the run has none.
func (r *Report) Figures(id string, m Metric) []float64 {
	outs := r.Outcomes[id]
	v := make([]float64, len(outs))
	for i, o := range outs {
		v[i] = math.NaN()
		if o.Done && o.Err == nil {
			v[i] = m.of(o.Result)
		}
	}
	return v
}

// Summary summarizes the figure m of measurement id over the runs.
func (r *Report) Summary(id string, m Metric) Summary { return Summarize(r.Figures(id, m)) }

// Ratio is a RatioDef with its value: the median and range of the per-run ratios.
type Ratio struct {
	RatioDef
	Summary
}

// Ratios returns the report's ratios, each computed run by run.
func (r *Report) Ratios() []Ratio {
	var out []Ratio
	for _, d := range RatioDefs(r.Specs) {
		out = append(out, Ratio{d, Summarize(Ratios(r.Figures(d.Num, d.Metric), r.Figures(d.Den, d.Metric)))})
	}
	return out
}

// Progress is called after each measurement of each run.
type Progress func(run int, s Spec, o Outcome)

// Run makes every measurement of cfg cfg.Runs times, interleaved: in each run, every measurement
// once, in the order of cfg.Specs. The child process starts once for all of them (again if it
// breaks). A measurement that fails is recorded and the runs go on; Run returns early, with the
// report so far, when ctx ends or the child cannot be kept going.
func Run(ctx context.Context, cfg Config, progress Progress) (*Report, error) {
	specs, err := cfg.Specs()
	if err != nil {
		return nil, err
	}
	rep := &Report{Config: cfg, Specs: specs, Outcomes: make(map[string][]Outcome)}
	for _, s := range specs {
		rep.Outcomes[s.ID] = make([]Outcome, cfg.Runs)
	}
	var ch *Child
	defer func() {
		if ch != nil {
			ch.Close()
		}
	}()
	restarts := 0
	for run := range cfg.Runs {
		for _, s := range specs {
			if err := ctx.Err(); err != nil {
				return rep, err
			}
			if s.Kind.TwoProcess() && ch == nil {
				if ch, err = StartChild(ctx, cfg.Child); err != nil {
					return rep, err
				}
				rep.ChildPIDs = append(rep.ChildPIDs, ch.PID())
			}
			s.Tag = rand.Uint64()
			res, err := measureWatched(ctx, cfg, ch, s)
			o := Outcome{Result: res, Err: err, Done: true}
			rep.Outcomes[s.ID][run] = o
			if progress != nil {
				progress(run, s, o)
			}
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			if ch != nil && ch.broken != nil {
				cerr := ch.Close()
				ch = nil
				if restarts++; restarts > maxChildRestarts {
					return rep, fmt.Errorf("the child process broke %d times; last: %w", restarts, errors.Join(err, cerr))
				}
			}
		}
	}
	var closeErr error
	if ch != nil {
		closeErr = ch.Close()
		ch = nil
	}
	if cfg.Procs != ProcsTwo && cfg.IdleQPs > 0 && cfg.wants(GroupIdle) {
		idle, err := Idle(cfg.IdleQPs, cfg.addr(addrIdle), cfg.addr(addrIdlePeer))
		if err != nil {
			rep.IdleErr = err
		} else {
			rep.Idle = &idle
		}
	}
	return rep, closeErr
}

// measureWatched makes one run of s, cut short if the child dies meanwhile, and notes the UDP
// datagrams the kernel dropped meanwhile.
func measureWatched(ctx context.Context, cfg Config, ch *Child, s Spec) (res Result, err error) {
	if before, ok := readUDPDrops(); ok {
		defer func() {
			if after, ok := readUDPDrops(); ok {
				noteUDPDrops(&res, before, after)
			}
		}()
	}
	if ch == nil || !s.Kind.TwoProcess() {
		return measure(ctx, cfg, ch, s)
	}
	wctx, cancel := ch.watch(ctx)
	defer cancel()
	res, err = measure(wctx, cfg, ch, s)
	switch cause := context.Cause(wctx); {
	case err == nil || ctx.Err() != nil:
	case errors.Is(cause, ErrChild):
		err = fmt.Errorf("%w (%w)", cause, err)
	case ch.broken != nil && !errors.Is(err, ErrChild):
		err = fmt.Errorf("%w; %w", err, ch.broken) // the child's failure is the likely cause
	}
	return res, err
}

// measure makes one run of s.
func measure(ctx context.Context, cfg Config, ch *Child, s Spec) (Result, error) {
	parent, child := cfg.addr(addrParent), cfg.addr(addrChild)
	switch s.Kind {
	case GoroceWrite, GoroceRead, GoroceSend:
		return goroceStream(ctx, ch, s, parent, child)
	case GorocePingPong:
		return gorocePingPong(ctx, ch, s, parent, child)
	case TCPStream:
		return tcpStream(ctx, ch, s, parent, child)
	case UDPStream:
		return udpStream(ctx, ch, s, parent, child)
	case UDPPingPong:
		return udpPingPong(ctx, ch, s, parent, child)
	case LocalWrite:
		return localWrite(ctx, s, cfg.addr(addrLocalWriteA), cfg.addr(addrLocalWriteB))
	case LocalUDP:
		return localUDP(ctx, s, cfg.addr(addrLocalUDPA), cfg.addr(addrLocalUDPB))
	case LocalPingPong:
		return localPingPong(ctx, s, cfg.addr(addrLocalPingA), cfg.addr(addrLocalPingB))
	case LocalUDPPingPong:
		return localUDPPingPong(ctx, s, cfg.addr(addrLocalUDPPingA), cfg.addr(addrLocalUDPPingB))
	}
	return newResult(), fmt.Errorf("unknown measurement kind %q", s.Kind)
}
