package sim

import "time"

// Time is virtual time in picoseconds since the start of a run. Picoseconds keep serialization times
// exact: a 4 KiB frame takes 332.64 ns at 100 Gb/s.
type Time int64

// Units of virtual time.
const (
	Picosecond  Time = 1
	Nanosecond  Time = 1000
	Microsecond Time = 1000 * Nanosecond
	Millisecond Time = 1000 * Microsecond
	Second      Time = 1000 * Millisecond
)

// FromDuration converts a duration to virtual time.
func FromDuration(d time.Duration) Time { return Time(d) * Nanosecond }

// Duration returns t as a duration, truncated to the nanosecond.
func (t Time) Duration() time.Duration { return time.Duration(t / Nanosecond) }

// Seconds returns t in seconds.
func (t Time) Seconds() float64 { return float64(t) / float64(Second) }

func (t Time) String() string { return t.Duration().String() }

// epoch is the engine time of virtual time zero. Engines only compare and subtract times, so any fixed
// instant works; a fixed one keeps runs reproducible.
var epoch = time.Unix(1_700_000_000, 0)

// engineTime converts virtual time to the time.Time the engines take.
func engineTime(t Time) time.Time { return epoch.Add(t.Duration()) }

// fromEngine converts an engine deadline back to virtual time; the zero time maps to 0.
func fromEngine(d time.Time) Time {
	if d.IsZero() {
		return 0
	}
	return FromDuration(d.Sub(epoch))
}

// evKind says what an event does. Events are plain structs in a slice-backed heap: no interface boxing,
// no allocation per event.
type evKind uint8

const (
	evTxDone evKind = iota // a port finished serializing pkt
	evArrive               // pkt arrives at the far end of port obj's link
	evTimer                // endpoint obj's engine deadline
	evPause                // PFC: port obj is paused (arg 1) or resumed (arg 0)
	evCall                 // run calls[obj]: rare events scheduled with At
)

type event struct {
	at   Time
	seq  uint64 // scheduling order: ties run first-scheduled first
	pkt  *packet
	arg  int64
	obj  int32
	kind evKind
}

// eventHeap is a binary min-heap ordered by (at, seq).
type eventHeap []event

func (h eventHeap) less(i, j int) bool {
	return h[i].at < h[j].at || h[i].at == h[j].at && h[i].seq < h[j].seq
}

func (h *eventHeap) push(e event) {
	*h = append(*h, e)
	a := *h
	i := len(a) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !a.less(i, p) {
			break
		}
		a[i], a[p] = a[p], a[i]
		i = p
	}
}

func (h *eventHeap) pop() event {
	a := *h
	e := a[0]
	n := len(a) - 1
	a[0] = a[n]
	a[n] = event{}
	a = a[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && a.less(r, l) {
			m = r
		}
		if !a.less(m, i) {
			break
		}
		a[i], a[m] = a[m], a[i]
		i = m
	}
	*h = a
	return e
}
