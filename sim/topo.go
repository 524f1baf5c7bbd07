package sim

import "fmt"

// Topology is a built network with the ports worth watching.
type Topology struct {
	Hosts    []*Host
	Switches []*Switch
	// Watch are the ports where queues build: the bottleneck of a dumbbell or an incast, every
	// switch port of a leaf-spine.
	Watch []*Port
}

func hostCfg(t HostConfig, name string) HostConfig {
	t.Name = name
	return t
}

// BackToBack joins two hosts with one cable and no switch.
func BackToBack(s *Sim, link LinkConfig, hc HostConfig) *Topology {
	a := s.AddHost(hostCfg(hc, "a"))
	b := s.AddHost(hostCfg(hc, "b"))
	l := s.Connect(a, b, link)
	return &Topology{Hosts: []*Host{a, b}, Watch: []*Port{l.A, l.B}}
}

// Dumbbell builds n senders (s0..) on a left switch and n receivers (r0..) on a right switch, the
// switches joined by one bottleneck link. Hosts holds the senders, then the receivers.
func Dumbbell(s *Sim, n int, edge, bottleneck LinkConfig, sc SwitchConfig, hc HostConfig) *Topology {
	l := s.AddSwitch("swL", sc)
	r := s.AddSwitch("swR", sc)
	t := &Topology{Switches: []*Switch{l, r}}
	for i := 0; i < n; i++ {
		h := s.AddHost(hostCfg(hc, fmt.Sprintf("s%d", i)))
		s.Connect(h, l, edge)
		t.Hosts = append(t.Hosts, h)
	}
	for i := 0; i < n; i++ {
		h := s.AddHost(hostCfg(hc, fmt.Sprintf("r%d", i)))
		s.Connect(r, h, edge)
		t.Hosts = append(t.Hosts, h)
	}
	mid := s.Connect(l, r, bottleneck)
	t.Watch = []*Port{mid.A}
	return t
}

// Incast builds n senders (s0..) and one receiver (r) on one switch. Hosts holds the senders, then the
// receiver; Watch is the receiver's switch port, where the incast queue builds.
func Incast(s *Sim, n int, link LinkConfig, sc SwitchConfig, hc HostConfig) *Topology {
	sw := s.AddSwitch("sw", sc)
	t := &Topology{Switches: []*Switch{sw}}
	for i := 0; i < n; i++ {
		h := s.AddHost(hostCfg(hc, fmt.Sprintf("s%d", i)))
		s.Connect(h, sw, link)
		t.Hosts = append(t.Hosts, h)
	}
	r := s.AddHost(hostCfg(hc, "r"))
	l := s.Connect(sw, r, link)
	t.Hosts = append(t.Hosts, r)
	t.Watch = []*Port{l.A}
	return t
}

// LeafSpine builds a two-tier Clos: leaves leaf switches (leaf0..) with hostsPerLeaf hosts each
// (h<leaf>.<i>), every leaf linked to every one of spines spine switches (spine0..). Leaves spread
// traffic to other leaves over the spines by ECMP on the UDP source port. Hosts is leaf by leaf; Watch
// holds every leaf uplink and every spine downlink.
func LeafSpine(s *Sim, leaves, spines, hostsPerLeaf int, access, uplink LinkConfig, sc SwitchConfig, hc HostConfig) *Topology {
	t := &Topology{}
	var ls, ss []*Switch
	for i := 0; i < leaves; i++ {
		c := sc
		c.ECMPSeed ^= uint64(i+1) * 0xD1B54A32D192ED03
		ls = append(ls, s.AddSwitch(fmt.Sprintf("leaf%d", i), c))
	}
	for i := 0; i < spines; i++ {
		c := sc
		c.ECMPSeed ^= uint64(i+101) * 0xD1B54A32D192ED03
		ss = append(ss, s.AddSwitch(fmt.Sprintf("spine%d", i), c))
	}
	for i, l := range ls {
		for k := 0; k < hostsPerLeaf; k++ {
			h := s.AddHost(hostCfg(hc, fmt.Sprintf("h%d.%d", i, k)))
			s.Connect(h, l, access)
			t.Hosts = append(t.Hosts, h)
		}
	}
	for _, l := range ls {
		for _, sp := range ss {
			k := s.Connect(l, sp, uplink)
			t.Watch = append(t.Watch, k.A, k.B)
		}
	}
	t.Switches = append(ls, ss...)
	return t
}
