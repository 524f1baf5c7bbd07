package goroce

import (
	"fmt"

	"github.com/goroce/goroce/internal/datapath"
	"github.com/goroce/goroce/qp"
)

// EventType is the kind of an asynchronous event, as enum ibv_event_type. IBTA Vol 1 11.6.3.
type EventType uint8

// Asynchronous events.
const (
	// EventQPFatal: the QP entered the error state because of an error (IBV_EVENT_QP_FATAL): a request
	// failed, the peer NAKed, a retry counter ran out, or a completion did not fit its CQ. Its work
	// requests complete with an error or WR_FLUSH_ERR.
	EventQPFatal EventType = iota + 1
	// EventCQError: a completion did not fit CQ (IBV_EVENT_CQ_ERR). The completion is lost, the QP
	// that produced it enters the error state (EventQPFatal follows) and CQ.Overflowed reports true.
	EventCQError
	// EventQPLastWQEReached: a QP on an SRQ entered the error state and takes no more receives from it
	// (IBV_EVENT_QP_LAST_WQE_REACHED); the program may destroy it.
	EventQPLastWQEReached
	// EventSRQLimitReached: fewer receives than SRQ.SetLimit asked for are left posted on SRQ
	// (IBV_EVENT_SRQ_LIMIT_REACHED). The limit disarms; set it again to hear of it again.
	EventSRQLimitReached
)

func (t EventType) String() string {
	switch t {
	case EventQPFatal:
		return "QP fatal"
	case EventCQError:
		return "CQ error"
	case EventQPLastWQEReached:
		return "last WQE reached"
	case EventSRQLimitReached:
		return "SRQ limit reached"
	}
	return fmt.Sprintf("EventType(%d)", uint8(t))
}

// AsyncEvent is an asynchronous event, as struct ibv_async_event: its type and the object it concerns.
// For EventCQError both QP and CQ are set.
type AsyncEvent struct {
	Type EventType
	QP   *QP
	CQ   *CQ
	SRQ  *SRQ
}

func (e AsyncEvent) String() string {
	switch {
	case e.CQ != nil && e.QP != nil:
		return fmt.Sprintf("%v: CQ of QP %v", e.Type, e.QP.QPN())
	case e.QP != nil:
		return fmt.Sprintf("%v: QP %v", e.Type, e.QP.QPN())
	}
	return e.Type.String()
}

// eventQueueLen is how many events Device.Events holds for a program that does not read them.
const eventQueueLen = 256

// Events returns the device's asynchronous events, as ibv_get_async_event does. The channel holds the
// last 256 events not yet read; when it is full, new events are dropped and counted in
// Stats.EventsDropped. It is closed when the device closes. There is nothing to acknowledge: an event
// read is done with.
func (d *Device) Events() <-chan AsyncEvent { return d.events }

// post queues e for Events without blocking the device's goroutine that found it.
func (d *Device) post(e AsyncEvent) {
	d.eventsMu.RLock()
	defer d.eventsMu.RUnlock()
	if d.eventsClosed {
		return
	}
	select {
	case d.events <- e:
	default:
		d.eventsDropped.Add(1)
	}
}

// closeEvents closes the events channel once no post can be sending on it.
func (d *Device) closeEvents() {
	d.eventsMu.Lock()
	defer d.eventsMu.Unlock()
	if !d.eventsClosed {
		d.eventsClosed = true
		close(d.events)
	}
}

// onEvent turns a datapath event into the API's.
func (d *Device) onEvent(e datapath.Event) {
	q, _ := e.QP.Owner.(*QP)
	if q == nil {
		return
	}
	ev := AsyncEvent{QP: q}
	switch e.Kind {
	case qp.EventFatal:
		ev.Type = EventQPFatal
	case qp.EventCQError:
		ev.Type = EventCQError
		if e.CQ != nil {
			ev.CQ, _ = e.CQ.Owner.(*CQ)
		}
	case qp.EventLastWQE:
		ev.Type = EventQPLastWQEReached
	default:
		return
	}
	d.post(ev)
}
